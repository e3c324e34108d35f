#include "loom/nn/norm.h"

#include <fmt/format.h>

#include "loom/dist/mappings.h"
#include "loom/kernels/pointwise.h"
#include "loom/memory/recompute.h"
#include "loom/nn/fused.h"
#include "loom/util/errors.h"

namespace loom::nn {

LayerNorm::LayerNorm(int64_t dim, double eps_, const parallel::ParamOptions& options)
    : eps(eps_), group_(options.tp) {
  weight = register_parameter("weight", at::empty({dim}, options.tensor_options()));
  bias = register_parameter("bias", at::empty({dim}, options.tensor_options()));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  // ATen's native LayerNorm is one fused pass already, and faster than kernels::layer_norm on
  // this CPU (loom_bench_kernels: 45 against 55 ms): it stays in use.
  auto run = [x, weight = weight, bias = bias, eps = eps] {
    const auto stats = at::promote_types(x.scalar_type(), at::kFloat);
    if (x.scalar_type() == stats) return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
    // Reduced precision: statistics in fp32, result back in the input dtype.
    auto y = at::layer_norm(x.to(stats), {weight.size(0)}, weight.to(stats), bias.to(stats), eps);
    return y.to(x.scalar_type());
  };
  // The next projection saves the output; the norm's backward keeps x and the weights.
  if (memory::selective()) return memory::refilled_in_backward(run(), run);
  return run();
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

namespace {

// RMSNorm over the last dimension: the fused kernel, or its composite reference (nn::fused_kernels).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return fused_kernels() ? kernels::rms_norm(x, weight, eps) : kernels::rms_norm_composite(x, weight, eps);
}

}  // namespace

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  if (!memory::selective()) return rms_norm(x, weight, eps);
  const bool fused = fused_kernels();  // as rms_norm reads it, fixed for the refill
  auto run = [x, weight = weight, eps = eps, fused] {
    return fused ? kernels::rms_norm(x, weight, eps) : kernels::rms_norm_composite(x, weight, eps);
  };
  return memory::refilled_in_backward(run(), run);  // as LayerNorm
}

SplitRMSNorm::SplitRMSNorm(int64_t dim, double eps_, const parallel::ParamOptions& options)
    : eps(eps_), group_(options.tp), dim_(dim) {
  if (group_.sequence_parallel && group_.size() > 1)
    throw ModelError("SplitRMSNorm: a norm over features cut across ranks cannot also cut the sequence");
  if (dim % group_.size() != 0)
    throw ModelError(fmt::format(
        "SplitRMSNorm: {} features do not split evenly over {} tensor-parallel ranks", dim, group_.size()));
  weight = register_parameter("weight", at::empty({dim / group_.size()}, options.tensor_options()));
}

std::map<std::string, parallel::ShardLayout> SplitRMSNorm::layouts() const {
  return {{"weight", parallel::split_layout(group_, 0)}};
}

at::Tensor SplitRMSNorm::forward(const at::Tensor& x) const {
  if (group_.size() == 1) return rms_norm(x, weight, eps);
  // kernels::rms_norm_composite's arithmetic, its mean taken over every rank's features.
  const at::Tensor x32 = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  const at::Tensor squares = dist::sum_over_region(x32.pow(2).sum(-1, /*keepdim=*/true), group_.comm);
  const at::Tensor normed = x32 * at::rsqrt(squares / static_cast<double>(dim_) + eps);
  return weight * normed.to(x.scalar_type());
}

}  // namespace loom::nn
