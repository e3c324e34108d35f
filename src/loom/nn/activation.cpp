#include "loom/nn/activation.h"

#include "loom/kernels/pointwise.h"
#include "loom/nn/fused.h"

namespace loom::nn {

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return fused_kernels() ? kernels::swiglu(gate, up) : kernels::swiglu_composite(gate, up);
}

}  // namespace loom::nn
