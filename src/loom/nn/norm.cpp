#include "loom/nn/norm.h"

#include "loom/kernels/pointwise.h"
#include "loom/nn/fused.h"

namespace loom::nn {

LayerNorm::LayerNorm(int64_t dim, double eps_, const parallel::ParamOptions& options)
    : eps(eps_), group_(options.tp) {
  weight = register_parameter("weight", at::empty({dim}, options.tensor_options()));
  bias = register_parameter("bias", at::empty({dim}, options.tensor_options()));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  // ATen's native LayerNorm is one fused pass already, and faster than kernels::layer_norm on
  // this CPU (loom_bench_kernels: 45 against 55 ms): it stays in use.
  const auto stats = at::promote_types(x.scalar_type(), at::kFloat);
  if (x.scalar_type() == stats) return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
  // Reduced precision: statistics in fp32, result back in the input dtype.
  auto y = at::layer_norm(x.to(stats), {weight.size(0)}, weight.to(stats), bias.to(stats), eps);
  return y.to(x.scalar_type());
}

RMSNorm::RMSNorm(int64_t dim, double eps_, const parallel::ParamOptions& options)
    : eps(eps_), group_(options.tp) {
  weight = register_parameter("weight", at::empty({dim}, options.tensor_options()));
}

std::map<std::string, parallel::ShardLayout> LayerNorm::layouts() const {
  return {{"weight", parallel::whole_layout(group_)}, {"bias", parallel::whole_layout(group_)}};
}

std::map<std::string, parallel::ShardLayout> RMSNorm::layouts() const {
  return {{"weight", parallel::whole_layout(group_)}};
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  return fused_kernels() ? kernels::rms_norm(x, weight, eps) : kernels::rms_norm_composite(x, weight, eps);
}

}  // namespace loom::nn
