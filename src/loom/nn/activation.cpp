#include "loom/nn/activation.h"

#include "loom/kernels/pointwise.h"
#include "loom/memory/recompute.h"
#include "loom/nn/fused.h"

namespace loom::nn {

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  const bool fused = fused_kernels();
  auto run = [gate, up, fused] {
    return fused ? kernels::swiglu(gate, up) : kernels::swiglu_composite(gate, up);
  };
  // The down projection saves the output; swiglu's backward keeps gate and up.
  if (memory::selective()) return memory::refilled_in_backward(run(), run);
  return run();
}

namespace {
at::Tensor quick_gelu_composite(const at::Tensor& x) { return x * at::sigmoid(1.702 * x); }
}  // namespace

at::Tensor quick_gelu(const at::Tensor& x) {
  if (!memory::selective()) return quick_gelu_composite(x);
  // Backward keeps x only: the sigmoid is made again in the checkpoint's backward, and the output
  // (which fc2 saves) before the block's.
  at::Tensor out =
      memory::checkpoint([](const std::vector<at::Tensor>& in) { return quick_gelu_composite(in[0]); }, {x});
  return memory::refilled_in_backward(out, [x] { return quick_gelu_composite(x); });
}

}  // namespace loom::nn
