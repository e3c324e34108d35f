// Host side of the row-wise CUDA kernels (pointwise_kernels.cuh): RMSNorm, SwiGLU and the rotary
// embedding, forward and backward.
#include <algorithm>

#include "loom/kernels/cuda/launch.h"
#include "loom/kernels/cuda/ops.h"
#include "loom/kernels/cuda/pointwise_kernels.cuh"

namespace LOOM_CUDA_NAMESPACE {
namespace {

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const DeviceGuard guard(x.device());
  const int64_t d = x.size(-1), heads = x.size(-2), positions = x.numel() / (heads * d);
  at::Tensor y = at::empty_like(x);
  const int64_t pairs = positions * heads * (d / 2);
  dispatch_floating(x.scalar_type(), "rotary", [&](auto tag) {
    using T = decltype(tag);
    launch(backward ? &rotary_kernel<T, true> : &rotary_kernel<T, false>,
           {blocks_for(pairs, kElementThreads)}, kElementThreads, x.data_ptr<T>(), cos.data_ptr<float>(),
           sin.data_ptr<float>(), y.data_ptr<T>(), positions, heads, d);
  });
  return y;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                   double eps) {
  const DeviceGuard guard(x.device());
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  const at::ScalarType out_type = at::promote_types(x.scalar_type(), weight.scalar_type());
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(out_type));
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  dispatch_floating(x.scalar_type(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    if (out_type == x.scalar_type()) {
      launch(rms_norm_forward_kernel<T, T>, {static_cast<unsigned>(rows)}, kNormThreads, x.data_ptr<T>(),
             w.data_ptr<float>(), y.data_ptr<T>(), rstd.data_ptr<float>(), d, static_cast<float>(eps));
    } else if (out_type == at::kFloat) {
      launch(rms_norm_forward_kernel<T, float>, {static_cast<unsigned>(rows)}, kNormThreads, x.data_ptr<T>(),
             w.data_ptr<float>(), y.data_ptr<float>(), rstd.data_ptr<float>(), d, static_cast<float>(eps));
    } else {
      throw ModelError(std::string("rms_norm: no CUDA kernel for x ") + c10::toString(x.scalar_type()) +
                       " with weight " + c10::toString(weight.scalar_type()));
    }
  });
  return {y, rstd};
}

std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                    const at::Tensor& weight, const at::Tensor& rstd) {
  const DeviceGuard guard(x.device());
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  // dy in x's dtype or fp32 (the output's dtype when the weight is fp32 and x is not).
  const at::Tensor g = dy.scalar_type() == x.scalar_type() ? dy.contiguous() : dy.to(at::kFloat).contiguous();
  at::Tensor dx = at::empty_like(x);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(rows, kNormBlocks));
  at::Tensor partial = at::zeros({blocks, d}, x.options().dtype(at::kFloat));
  dispatch_floating(x.scalar_type(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    if (g.scalar_type() == x.scalar_type())
      launch(rms_norm_backward_kernel<T, T>, {static_cast<unsigned>(blocks)}, kNormThreads, g.data_ptr<T>(),
             x.data_ptr<T>(), w.data_ptr<float>(), rstd.data_ptr<float>(), dx.data_ptr<T>(),
             partial.data_ptr<float>(), rows, d);
    else
      launch(rms_norm_backward_kernel<T, float>, {static_cast<unsigned>(blocks)}, kNormThreads,
             g.data_ptr<float>(), x.data_ptr<T>(), w.data_ptr<float>(), rstd.data_ptr<float>(),
             dx.data_ptr<T>(), partial.data_ptr<float>(), rows, d);
  });
  return {dx, partial.sum(0)};
}

at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up) {
  const DeviceGuard guard(gate.device());
  at::Tensor y = at::empty_like(gate);
  const int64_t n = gate.numel();
  dispatch_floating(gate.scalar_type(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    launch(swiglu_forward_kernel<T>, {blocks_for(n, kElementThreads)}, kElementThreads, gate.data_ptr<T>(),
           up.data_ptr<T>(), y.data_ptr<T>(), n);
  });
  return y;
}

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& dy, const at::Tensor& gate,
                                                  const at::Tensor& up) {
  const DeviceGuard guard(gate.device());
  const at::Tensor g = dy.to(gate.scalar_type()).contiguous();
  at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
  const int64_t n = gate.numel();
  dispatch_floating(gate.scalar_type(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    launch(swiglu_backward_kernel<T>, {blocks_for(n, kElementThreads)}, kElementThreads, g.data_ptr<T>(),
           gate.data_ptr<T>(), up.data_ptr<T>(), dgate.data_ptr<T>(), dup.data_ptr<T>(), n);
  });
  return {dgate, dup};
}

at::Tensor rotary_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return rotary(x, cos, sin, /*backward=*/false);
}

at::Tensor rotary_backward(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin) {
  return rotary(dy, cos, sin, /*backward=*/true);
}

at::Device device() {
#if defined(__CUDACC__)
  return {at::kCUDA, static_cast<c10::DeviceIndex>(c10::cuda::current_device())};
#else
  return at::kCPU;
#endif
}

bool emulated() {
#if defined(__CUDACC__)
  return false;
#else
  return true;
#endif
}

}  // namespace LOOM_CUDA_NAMESPACE
