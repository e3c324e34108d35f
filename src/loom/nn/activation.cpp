#include "loom/nn/activation.h"

#include "loom/kernels/pointwise.h"
#include "loom/memory/recompute.h"
#include "loom/nn/fused.h"

namespace loom::nn {

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return fused_kernels() ? kernels::swiglu(gate, up) : kernels::swiglu_composite(gate, up);
}

namespace {
at::Tensor quick_gelu_composite(const at::Tensor& x) { return x * at::sigmoid(1.702 * x); }
}  // namespace

at::Tensor quick_gelu(const at::Tensor& x) {
  if (memory::selective())
    return memory::checkpoint([](const std::vector<at::Tensor>& in) { return quick_gelu_composite(in[0]); },
                              {x});
  return quick_gelu_composite(x);
}

}  // namespace loom::nn
