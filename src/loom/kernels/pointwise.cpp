#include "loom/kernels/pointwise.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "loom/kernels/cpu/exp.h"
#include "loom/kernels/cpu/vector.h"
#include "loom/kernels/cuda/ops.h"
#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

using cpu::lane_sum;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kRowGrain = 16;  // rows per parallel task at least

// fp32 copy of a bf16/fp32 tensor, contiguous (shares storage when it already is one).
at::Tensor fp32(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

// The norms' backward passes: their weight gradients are sums over all rows, so the rows are dealt
// to at most one task per thread, each summing into its own partial row (added up at the end).
int64_t backward_tasks(int64_t rows) {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows / kRowGrain));
}

// Calls row(task, r) for every row r, task by task; tasks run in parallel.
template <typename RowFn>
void for_rows_by_task(int64_t rows, int64_t tasks, const RowFn& row) {
  const int64_t per_task = (rows + tasks - 1) / tasks;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t r = t * per_task; r < std::min(rows, (t + 1) * per_task); ++r) row(t, r);
  });
}

// ---- RMSNorm ----

// y = w * round(x * r), r = 1/sqrt(mean(x^2) + eps); returns r.
LOOM_VECTOR_CLONES float rms_norm_row(const float* x, const float* w, float* y, int64_t d, float eps,
                                      bool round) {
  const float sum = lane_sum(d, [&](int64_t i) { return x[i] * x[i]; });
  const float r = 1.0F / std::sqrt(sum / static_cast<float>(d) + eps);
  if (round) {
    for (int64_t i = 0; i < d; ++i) y[i] = w[i] * cpu::round_bf16(x[i] * r);
  } else {
    for (int64_t i = 0; i < d; ++i) y[i] = w[i] * (x[i] * r);
  }
  return r;
}

// dx = r * (g - x * r^2 * mean(g * x)) with g = dy * w; dw += dy * x * r (this task's partial sum).
LOOM_VECTOR_CLONES void rms_norm_backward_row(const float* x, const float* w, const float* dy, float r,
                                              float* dx, float* dw, int64_t d) {
  const float dot = lane_sum(d, [&](int64_t i) { return dy[i] * w[i] * x[i]; });
  const float c = r * r * r * dot / static_cast<float>(d);
  for (int64_t i = 0; i < d; ++i) {
    dx[i] = r * dy[i] * w[i] - c * x[i];
    dw[i] += dy[i] * x[i] * r;
  }
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const int64_t d = x.size(-1);
    if (weight.dim() != 1 || weight.size(0) != d)
      throw ModelError(fmt::format("rms_norm: weight of {} elements for rows of {}", weight.numel(), d));
    if constexpr (cuda::kBuilt) {
      if (x.is_cuda()) {
        const at::Tensor xc = x.contiguous();
        auto [y, rstd] = cuda::rms_norm_forward(xc, weight, eps);
        ctx->save_for_backward({xc, weight, rstd});
        return y;
      }
    }
    const at::Tensor x32 = fp32(x), w32 = fp32(weight);
    const int64_t rows = x32.numel() / d;
    at::Tensor y = at::empty(x32.sizes(), at::kFloat);
    at::Tensor scale = at::empty({rows}, at::kFloat);
    const bool round = x.scalar_type() == at::kBFloat16;
    const float *xp = x32.data_ptr<float>(), *wp = w32.data_ptr<float>();
    float *yp = y.data_ptr<float>(), *sp = scale.data_ptr<float>();
    at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        sp[r] = rms_norm_row(xp + r * d, wp, yp + r * d, d, static_cast<float>(eps), round);
    });
    ctx->save_for_backward({x, weight, scale});
    return y.to(at::promote_types(x.scalar_type(), weight.scalar_type()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if constexpr (cuda::kBuilt) {
      if (saved[0].is_cuda()) {
        auto [dx, dweight] = cuda::rms_norm_backward(grads[0].contiguous(), saved[0], saved[1], saved[2]);
        return {dx, dweight.to(saved[1].scalar_type()), at::Tensor()};
      }
    }
    const at::Tensor x32 = fp32(saved[0]), w32 = fp32(saved[1]), scale = saved[2], dy = fp32(grads[0]);
    const int64_t d = x32.size(-1), rows = x32.numel() / d;
    at::Tensor dx = at::empty(x32.sizes(), at::kFloat);
    const int64_t tasks = backward_tasks(rows);
    at::Tensor partial = at::zeros({tasks, d}, at::kFloat);
    const float *xp = x32.data_ptr<float>(), *wp = w32.data_ptr<float>(), *sp = scale.data_ptr<float>(),
                *gp = dy.data_ptr<float>();
    float *dxp = dx.data_ptr<float>(), *pp = partial.data_ptr<float>();
    for_rows_by_task(rows, tasks, [&](int64_t t, int64_t r) {
      rms_norm_backward_row(xp + r * d, wp, gp + r * d, sp[r], dxp + r * d, pp + t * d, d);
    });
    return {dx.to(saved[0].scalar_type()), partial.sum(0).to(saved[1].scalar_type()), at::Tensor()};
  }
};

// ---- LayerNorm ----

// y = (x - mean) * rstd * w + b; returns (mean, rstd).
LOOM_VECTOR_CLONES std::pair<float, float> layer_norm_row(const float* x, const float* w, const float* b,
                                                          float* y, int64_t d, float eps) {
  const float mean = lane_sum(d, [&](int64_t i) { return x[i]; }) / static_cast<float>(d);
  const float squares = lane_sum(d, [&](int64_t i) { return (x[i] - mean) * (x[i] - mean); });
  const float rstd = 1.0F / std::sqrt(squares / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
  return {mean, rstd};
}

// With xhat = (x - mean) rstd and g = dy w: dx = rstd (g - mean(g) - xhat mean(g xhat));
// dw += dy xhat, db += dy (this task's partial sums).
LOOM_VECTOR_CLONES void layer_norm_backward_row(const float* x, const float* w, const float* dy, float mean,
                                                float rstd, float* dx, float* dw, float* db, int64_t d) {
  const float sum_g = lane_sum(d, [&](int64_t i) { return dy[i] * w[i]; });
  const float sum_gx = lane_sum(d, [&](int64_t i) { return dy[i] * w[i] * (x[i] - mean) * rstd; });
  const float mean_g = sum_g / static_cast<float>(d), mean_gx = sum_gx / static_cast<float>(d);
  for (int64_t i = 0; i < d; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    dx[i] = rstd * (dy[i] * w[i] - mean_g - xhat * mean_gx);
    dw[i] += dy[i] * xhat;
    db[i] += dy[i];
  }
}

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    const int64_t d = x.size(-1);
    if (weight.dim() != 1 || weight.size(0) != d || bias.dim() != 1 || bias.size(0) != d)
      throw ModelError(fmt::format("layer_norm: weight of {} and bias of {} elements for rows of {}",
                                   weight.numel(), bias.numel(), d));
    const at::Tensor x32 = fp32(x), w32 = fp32(weight), b32 = fp32(bias);
    const int64_t rows = x32.numel() / d;
    at::Tensor y = at::empty(x32.sizes(), at::kFloat);
    at::Tensor stats = at::empty({rows, 2}, at::kFloat);  // mean, rstd
    const float *xp = x32.data_ptr<float>(), *wp = w32.data_ptr<float>(), *bp = b32.data_ptr<float>();
    float *yp = y.data_ptr<float>(), *sp = stats.data_ptr<float>();
    at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const auto [mean, rstd] = layer_norm_row(xp + r * d, wp, bp, yp + r * d, d, static_cast<float>(eps));
        sp[2 * r] = mean;
        sp[2 * r + 1] = rstd;
      }
    });
    ctx->save_for_backward({x, weight, bias, stats});
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor x32 = fp32(saved[0]), w32 = fp32(saved[1]), stats = saved[3], dy = fp32(grads[0]);
    const int64_t d = x32.size(-1), rows = x32.numel() / d;
    at::Tensor dx = at::empty(x32.sizes(), at::kFloat);
    const int64_t tasks = backward_tasks(rows);
    at::Tensor partial = at::zeros({tasks, 2, d}, at::kFloat);  // dw, db per task
    const float *xp = x32.data_ptr<float>(), *wp = w32.data_ptr<float>(), *sp = stats.data_ptr<float>(),
                *gp = dy.data_ptr<float>();
    float *dxp = dx.data_ptr<float>(), *pp = partial.data_ptr<float>();
    for_rows_by_task(rows, tasks, [&](int64_t t, int64_t r) {
      layer_norm_backward_row(xp + r * d, wp, gp + r * d, sp[2 * r], sp[2 * r + 1], dxp + r * d,
                              pp + t * 2 * d, pp + t * 2 * d + d, d);
    });
    const at::Tensor sums = partial.sum(0);
    return {dx.to(saved[0].scalar_type()), sums[0].to(saved[1].scalar_type()),
            sums[1].to(saved[2].scalar_type()), at::Tensor()};
  }
};

// ---- SwiGLU ----

// Elements go through in blocks whose e^-g is computed by the vectorised exp (glibc's expf is a
// scalar call, which left the fused pass slower than ATen's vectorised composite).
constexpr int64_t kBlock = 1024;

// s = sigmoid(g) for a block, via the vectorised exp. g is clamped at -88 (below it e^-g would
// overflow), where sigmoid is 0 to fp32 precision anyway.
LOOM_VECTOR_CLONES void sigmoid_block(const float* g, float* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) s[i] = -std::max(g[i], -88.0F);
  cpu::exp_in_place(s, n);
  for (int64_t i = 0; i < n; ++i) s[i] = 1.0F / (1.0F + s[i]);
}

LOOM_VECTOR_CLONES void swiglu_rows(const float* g, const float* u, float* y, int64_t n) {
  float s[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    sigmoid_block(g + start, s, m);
    for (int64_t i = 0; i < m; ++i) y[start + i] = g[start + i] * s[i] * u[start + i];
  }
}

// d gate = dy * u * s * (1 + g * (1 - s)), d up = dy * g * s, s = sigmoid(g).
LOOM_VECTOR_CLONES void swiglu_backward_rows(const float* g, const float* u, const float* dy, float* dg,
                                             float* du, int64_t n) {
  float s[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    sigmoid_block(g + start, s, m);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t k = start + i;
      du[k] = dy[k] * g[k] * s[i];
      dg[k] = dy[k] * u[k] * s[i] * (1.0F + g[k] * (1.0F - s[i]));
    }
  }
}

constexpr int64_t kElementGrain = 1 << 14;

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    if (gate.sizes() != up.sizes())
      throw ModelError(fmt::format("swiglu: gate [{}] and up [{}] differ", fmt::join(gate.sizes(), ", "),
                                   fmt::join(up.sizes(), ", ")));
    if constexpr (cuda::kBuilt) {
      if (gate.is_cuda()) {
        const at::Tensor g = gate.contiguous(), u = up.contiguous();
        ctx->save_for_backward({g, u});
        return cuda::swiglu_forward(g, u);
      }
    }
    const at::Tensor g = fp32(gate), u = fp32(up);
    at::Tensor y = at::empty(g.sizes(), at::kFloat);
    const float *gp = g.data_ptr<float>(), *upp = u.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
      swiglu_rows(gp + begin, upp + begin, yp + begin, end - begin);
    });
    ctx->save_for_backward({gate, up});
    return y.to(gate.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if constexpr (cuda::kBuilt) {
      if (saved[0].is_cuda()) {
        auto [dgate, dup] = cuda::swiglu_backward(grads[0].contiguous(), saved[0], saved[1]);
        return {dgate, dup};
      }
    }
    const at::Tensor g = fp32(saved[0]), u = fp32(saved[1]), dy = fp32(grads[0]);
    at::Tensor dg = at::empty(g.sizes(), at::kFloat), du = at::empty(g.sizes(), at::kFloat);
    const float *gp = g.data_ptr<float>(), *upp = u.data_ptr<float>(), *dyp = dy.data_ptr<float>();
    float *dgp = dg.data_ptr<float>(), *dup = du.data_ptr<float>();
    at::parallel_for(0, g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
      swiglu_backward_rows(gp + begin, upp + begin, dyp + begin, dgp + begin, dup + begin, end - begin);
    });
    return {dg.to(saved[0].scalar_type()), du.to(saved[1].scalar_type())};
  }
};

// ---- Rotary embedding ----

// One position: heads rows of d, rotated by one (cos, sin) row; `sign` -1 applies the inverse
// rotation (the backward pass: the transpose of the forward's rotation).
LOOM_VECTOR_CLONES void rotary_rows(const float* x, const float* cos, const float* sin, float* y,
                                    int64_t heads, int64_t d, float sign) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* xh = x + h * d;
    float* yh = y + h * d;
    for (int64_t i = 0; i < half; ++i) {
      yh[i] = xh[i] * cos[i] - sign * xh[i + half] * sin[i];
      yh[i + half] = xh[i + half] * cos[i + half] + sign * xh[i] * sin[i + half];
    }
  }
}

// Forward: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2. Backward (the transpose):
// dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1; with c1 = c2 and s1 = s2 (HF's duplicated halves)
// that is the same rotation by -angle. General halves are handled exactly.
LOOM_VECTOR_CLONES void rotary_backward_rows(const float* dy, const float* cos, const float* sin, float* dx,
                                             int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* g = dy + h * d;
    float* o = dx + h * d;
    for (int64_t i = 0; i < half; ++i) {
      o[i] = g[i] * cos[i] + g[i + half] * sin[i + half];
      o[i + half] = g[i + half] * cos[i + half] - g[i] * sin[i];
    }
  }
}

struct RotaryShape {
  int64_t positions, heads, dim;
};

RotaryShape rotary_shape(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (x.dim() < 2 || x.size(-1) % 2 != 0)
    throw ModelError(
        fmt::format("rotary: x must be (..., heads, even dim), got [{}]", fmt::join(x.sizes(), ", ")));
  const int64_t d = x.size(-1), heads = x.size(-2), positions = x.numel() / (heads * d);
  for (const at::Tensor* t : {&cos, &sin})
    if (t->numel() != positions * d || t->size(-1) != d)
      throw ModelError(fmt::format("rotary: angles [{}] do not give one row of {} per position of x [{}]",
                                   fmt::join(t->sizes(), ", "), d, fmt::join(x.sizes(), ", ")));
  return {positions, heads, d};
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    const RotaryShape s = rotary_shape(x, cos, sin);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    if constexpr (cuda::kBuilt) {
      if (x.is_cuda()) return cuda::rotary_forward(x.contiguous(), fp32(cos), fp32(sin));
    }
    const at::Tensor x32 = fp32(x), c = fp32(cos), sn = fp32(sin);
    at::Tensor y = at::empty(x32.sizes(), at::kFloat);
    const float *xp = x32.data_ptr<float>(), *cp = c.data_ptr<float>(), *sp = sn.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, s.positions, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        rotary_rows(xp + p * s.heads * s.dim, cp + p * s.dim, sp + p * s.dim, yp + p * s.heads * s.dim,
                    s.heads, s.dim, 1.0F);
    });
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    if constexpr (cuda::kBuilt) {
      if (grads[0].is_cuda())
        return {cuda::rotary_backward(grads[0].to(dtype).contiguous(), fp32(saved[0]), fp32(saved[1])),
                at::Tensor(), at::Tensor()};
    }
    const at::Tensor dy = fp32(grads[0]), c = fp32(saved[0]), sn = fp32(saved[1]);
    const RotaryShape s = rotary_shape(dy, c, sn);
    at::Tensor dx = at::empty(dy.sizes(), at::kFloat);
    const float *gp = dy.data_ptr<float>(), *cp = c.data_ptr<float>(), *sp = sn.data_ptr<float>();
    float* dxp = dx.data_ptr<float>();
    at::parallel_for(0, s.positions, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        rotary_backward_rows(gp + p * s.heads * s.dim, cp + p * s.dim, sp + p * s.dim,
                             dxp + p * s.heads * s.dim, s.heads, s.dim);
    });
    return {dx.to(dtype), at::Tensor(), at::Tensor()};
  }
};

// Whether the fused kernels take these tensors: all on the CPU in fp32 or bf16, or all on CUDA (in
// a CUDA build) in fp32, bf16 or fp16. Others (fp64 in gradient checks, other devices) take the
// composite path.
bool kernels_take(std::initializer_list<const at::Tensor*> tensors) {
  const at::Device device = (*tensors.begin())->device();
  const bool on_cuda = cuda::kBuilt && device.is_cuda();
  if (!device.is_cpu() && !on_cuda) return false;
  for (const at::Tensor* t : tensors) {
    const at::ScalarType type = t->scalar_type();
    if (t->device() != device) return false;
    if (type != at::kFloat && type != at::kBFloat16 && !(on_cuda && type == at::kHalf)) return false;
  }
  return true;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!kernels_take({&x, &weight})) return rms_norm_composite(x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps);
}

at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto x32 = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  auto normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  // On CUDA, ATen's own layer norm is one fused kernel; run in fp32 (as the CPU kernel computes),
  // so the weight and bias gradients are fp32 sums too.
  if (x.is_cuda() && kernels_take({&x, &weight, &bias}))
    return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, weight.to(at::kFloat), bias.to(at::kFloat), eps)
        .to(x.scalar_type());
  if (!kernels_take({&x, &weight, &bias})) return layer_norm_composite(x, weight, bias, eps);
  return LayerNormFunction::apply(x, weight, bias, eps);
}

at::Tensor layer_norm_composite(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                double eps) {
  const auto stats = at::promote_types(x.scalar_type(), at::kFloat);
  auto x32 = x.to(stats);
  auto mean = x32.mean(-1, /*keepdim=*/true);
  auto centred = x32 - mean;
  auto normed = centred * at::rsqrt(centred.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * weight.to(stats) + bias.to(stats)).to(x.scalar_type());
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  if (!kernels_take({&gate, &up}) || gate.scalar_type() != up.scalar_type())
    return swiglu_composite(gate, up);
  return SwigluFunction::apply(gate, up);
}

at::Tensor swiglu_composite(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!kernels_take({&x, &cos, &sin})) return rotary_composite(x, cos, sin);
  if (x.dim() < 2) return RotaryFunction::apply(x, cos, sin);  // refused there, with the shapes
  // Angles that broadcast over x's leading dimensions become one row per position.
  std::vector<int64_t> rows = x.sizes().vec();
  rows[rows.size() - 2] = 1;
  return RotaryFunction::apply(x, cos.expand(rows), sin.expand(rows));
}

at::Tensor rotary_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto x32 = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  const int64_t half = x.size(-1) / 2;
  auto rotated = at::cat({-x32.narrow(-1, half, half), x32.narrow(-1, 0, half)}, -1);
  return (x32 * cos + rotated * sin).to(x.scalar_type());
}

}  // namespace loom::kernels
