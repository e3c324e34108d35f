#include "loom/kernels/channel_norm.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "loom/kernels/cpu/exp.h"
#include "loom/kernels/cpu/vector.h"
#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Positions per task: a task walks the C channel planes over one run of kChunk positions, so its
// per-position sums stay in registers or L1 and each plane is read in contiguous runs.
constexpr int64_t kChunk = 256;
constexpr float kMinNorm = 1e-12F;  // F.normalize's eps: norms below it are clamped to it

struct Layout {
  int64_t batch, channels, positions;  // x is [batch, channels, positions] in memory
  int64_t chunks() const { return (positions + kChunk - 1) / kChunk; }
  int64_t tasks() const { return batch * chunks(); }
};

Layout layout_of(const at::Tensor& x, const at::Tensor& gamma) {
  if (x.dim() < 3 || gamma.numel() != x.size(1))
    throw ModelError(
        fmt::format("channel_rms_norm: x [{}] must be [B, C, ...] with gamma of C elements, got {}",
                    fmt::join(x.sizes(), ", "), gamma.numel()));
  return {x.size(0), x.size(1), x.numel() / (x.size(0) * x.size(1))};
}

// s = sigmoid(n) for a run, via the vectorised exp (n clamped at -88, where sigmoid is 0 in fp32).
LOOM_VECTOR_CLONES void sigmoid_run(const float* n, float* s, int64_t m) {
  for (int64_t i = 0; i < m; ++i) s[i] = -std::max(n[i], -88.0F);
  cpu::exp_in_place(s, m);
  for (int64_t i = 0; i < m; ++i) s[i] = 1.0F / (1.0F + s[i]);
}

// One task's run of m positions: x points at channel 0 of the run, planes `stride` apart.
// factor[i] = sqrt(C) / max(||x_i||, eps); y = gamma * x * factor (rounded to bf16 when `round`),
// then silu.
LOOM_VECTOR_CLONES void forward_run(const float* x, const float* gamma, float* y, float* factor,
                                    int64_t channels, int64_t stride, int64_t m, float scale, bool silu,
                                    bool round) {
  float sum[kChunk] = {}, n[kChunk], s[kChunk];
  for (int64_t c = 0; c < channels; ++c) {
    const float* xc = x + c * stride;
    for (int64_t i = 0; i < m; ++i) sum[i] += xc[i] * xc[i];
  }
  for (int64_t i = 0; i < m; ++i) factor[i] = scale / std::max(std::sqrt(sum[i]), kMinNorm);
  for (int64_t c = 0; c < channels; ++c) {
    const float* xc = x + c * stride;
    float* yc = y + c * stride;
    for (int64_t i = 0; i < m; ++i) n[i] = gamma[c] * (xc[i] * factor[i]);
    if (round)
      for (int64_t i = 0; i < m; ++i) n[i] = cpu::round_bf16(n[i]);
    if (!silu) {
      std::copy(n, n + m, yc);
      continue;
    }
    sigmoid_run(n, s, m);
    for (int64_t i = 0; i < m; ++i) yc[i] = n[i] * s[i];
  }
}

// With n_c = gamma_c x_c f, f = sqrt(C)/||x||, and dn_c = dy_c (silu' at n_c when `silu`):
//   dx_j = f gamma_j dn_j - x_j f^3 / C * sum_c gamma_c dn_c x_c   (the second term 0 where the norm
//   was clamped: f does not depend on x there), dgamma_c += sum over positions of dn_c x_c f.
// dx first holds gamma dn (pass 1), then the gradient (pass 2).
LOOM_VECTOR_CLONES void backward_run(const float* x, const float* gamma, const float* dy, const float* factor,
                                     float* dx, float* dgamma, int64_t channels, int64_t stride, int64_t m,
                                     float scale, bool silu, bool round) {
  float dot[kChunk] = {}, n[kChunk], s[kChunk], dn[kChunk];
  for (int64_t c = 0; c < channels; ++c) {
    const float *xc = x + c * stride, *dyc = dy + c * stride;
    float* dxc = dx + c * stride;
    if (silu) {
      for (int64_t i = 0; i < m; ++i) n[i] = gamma[c] * (xc[i] * factor[i]);
      if (round)
        for (int64_t i = 0; i < m; ++i) n[i] = cpu::round_bf16(n[i]);
      sigmoid_run(n, s, m);
      for (int64_t i = 0; i < m; ++i) dn[i] = dyc[i] * s[i] * (1.0F + n[i] * (1.0F - s[i]));
    } else {
      std::copy(dyc, dyc + m, dn);
    }
    dgamma[c] += cpu::lane_sum(m, [&](int64_t i) { return dn[i] * (xc[i] * factor[i]); });
    for (int64_t i = 0; i < m; ++i) {
      dxc[i] = gamma[c] * dn[i];
      dot[i] += dxc[i] * xc[i];
    }
  }
  const float inverse_channels = 1.0F / (scale * scale), clamped_factor = scale / kMinNorm;
  float k[kChunk];
  for (int64_t i = 0; i < m; ++i) {
    const bool clamped = factor[i] >= clamped_factor;  // ||x|| <= eps: the forward's own quotient
    k[i] = clamped ? 0.0F : factor[i] * factor[i] * factor[i] * inverse_channels * dot[i];
  }
  for (int64_t c = 0; c < channels; ++c) {
    const float* xc = x + c * stride;
    float* dxc = dx + c * stride;
    for (int64_t i = 0; i < m; ++i) dxc[i] = factor[i] * dxc[i] - k[i] * xc[i];
  }
}

at::Tensor fp32(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

class ChannelRmsNormFunction : public torch::autograd::Function<ChannelRmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma, bool silu) {
    const Layout l = layout_of(x, gamma);
    const at::Tensor x32 = fp32(x), g32 = fp32(gamma);
    at::Tensor y = at::empty(x32.sizes(), at::kFloat);
    at::Tensor factor = at::empty({l.batch, l.positions}, at::kFloat);
    const float scale = std::sqrt(static_cast<float>(l.channels));
    const bool round = x.scalar_type() == at::kBFloat16;
    const float *xp = x32.data_ptr<float>(), *gp = g32.data_ptr<float>();
    float *yp = y.data_ptr<float>(), *fp = factor.data_ptr<float>();
    at::parallel_for(0, l.tasks(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / l.chunks(), start = (t % l.chunks()) * kChunk;
        const int64_t offset = b * l.channels * l.positions + start;
        forward_run(xp + offset, gp, yp + offset, fp + b * l.positions + start, l.channels, l.positions,
                    std::min(kChunk, l.positions - start), scale, silu, round);
      }
    });
    ctx->save_for_backward({x, gamma, factor});
    ctx->saved_data["silu"] = silu;
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool silu = ctx->saved_data["silu"].toBool();
    const Layout l = layout_of(saved[0], saved[1]);
    const at::Tensor x32 = fp32(saved[0]), g32 = fp32(saved[1]), factor = saved[2], dy = fp32(grads[0]);
    at::Tensor dx = at::empty(x32.sizes(), at::kFloat);
    // One partial gamma gradient per task, summed in task order: the same bits for any thread count.
    at::Tensor partial = at::zeros({l.tasks(), l.channels}, at::kFloat);
    const float scale = std::sqrt(static_cast<float>(l.channels));
    const bool round = saved[0].scalar_type() == at::kBFloat16;
    const float *xp = x32.data_ptr<float>(), *gp = g32.data_ptr<float>(), *fp = factor.data_ptr<float>(),
                *dyp = dy.data_ptr<float>();
    float *dxp = dx.data_ptr<float>(), *pp = partial.data_ptr<float>();
    at::parallel_for(0, l.tasks(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / l.chunks(), start = (t % l.chunks()) * kChunk;
        const int64_t offset = b * l.channels * l.positions + start;
        backward_run(xp + offset, gp, dyp + offset, fp + b * l.positions + start, dxp + offset,
                     pp + t * l.channels, l.channels, l.positions, std::min(kChunk, l.positions - start),
                     scale, silu, round);
      }
    });
    return {dx.to(saved[0].scalar_type()), partial.sum(0).view(saved[1].sizes()).to(saved[1].scalar_type()),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor channel_rms_norm(const at::Tensor& x, const at::Tensor& gamma, bool silu) {
  const auto takes = [&](const at::Tensor& t) {
    return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
  };
  if (!takes(x) || !takes(gamma)) return channel_rms_norm_composite(x, gamma, silu);
  return ChannelRmsNormFunction::apply(x, gamma, silu);
}

at::Tensor channel_rms_norm_composite(const at::Tensor& x, const at::Tensor& gamma, bool silu) {
  layout_of(x, gamma);
  const auto compute = at::promote_types(x.scalar_type(), at::kFloat);
  const at::Tensor x32 = x.to(compute);
  const at::Tensor norm =
      at::norm(x32, at::Scalar(2), at::IntArrayRef{1}, /*keepdim=*/true).clamp_min(kMinNorm);
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = x.size(1);
  const at::Tensor normed =
      (x32 / norm * std::sqrt(static_cast<double>(x.size(1))) * gamma.reshape(shape).to(compute))
          .to(x.scalar_type());
  return silu ? at::silu(normed) : normed;
}

}  // namespace loom::kernels
