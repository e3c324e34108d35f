#include "loom/parallel/flat_shard.h"

#include <fmt/format.h>

#include <algorithm>

#include "loom/util/errors.h"

namespace loom::parallel {

FlatShard::FlatShard(std::vector<std::string> names, std::vector<at::Tensor> params, int64_t rank,
                     int64_t ranks, bool copy_values)
    : names_(std::move(names)), params_(std::move(params)), rank_(rank), ranks_(ranks) {
  if (names_.size() != params_.size() || ranks < 1 || rank < 0 || rank >= ranks)
    throw ModelError(fmt::format("flat shard: {} names for {} parameters, rank {} of {}", names_.size(),
                                 params_.size(), rank, ranks));
  for (const at::Tensor& p : params_) {
    offsets_.push_back(numel_);
    numel_ += p.numel();
  }
  slice_ = std::max<int64_t>((numel_ + ranks - 1) / ranks, 1);
  master = at::zeros({slice_}, at::TensorOptions(at::kFloat).device(device()));
  grad = at::zeros({slice_}, at::TensorOptions(at::kFloat).device(device()));
  has_grad.assign(params_.size(), false);
  if (copy_values) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> values;
    for (const at::Tensor& p : params_) values.push_back(p.detach());
    take_slice(values, master);
  }
}

FlatShard::Overlap FlatShard::overlap(size_t i) const {
  const int64_t begin = rank_ * slice_;
  const int64_t start = std::max(offsets_[i], begin);
  const int64_t end = std::min(offsets_[i] + params_[i].numel(), begin + slice_);
  if (start >= end) return {};
  return {start - offsets_[i], start - begin, end - start};
}

void FlatShard::take_slice(const std::vector<at::Tensor>& values, at::Tensor& slice) const {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Overlap o = overlap(i);
    if (o.length == 0 || !values[i].defined()) continue;
    slice.narrow(0, o.in_slice, o.length).copy_(values[i].reshape({-1}).narrow(0, o.in_param, o.length));
  }
}

at::Tensor FlatShard::flatten(const std::vector<at::Tensor>& values, at::ScalarType dtype) const {
  at::NoGradGuard no_grad;
  at::Tensor flat = at::zeros({padded_numel()}, at::TensorOptions().dtype(dtype).device(device()));
  for (size_t i = 0; i < params_.size(); ++i)
    if (values[i].defined()) flat.narrow(0, offsets_[i], params_[i].numel()).copy_(values[i].reshape({-1}));
  return flat;
}

at::Tensor FlatShard::unflatten(const at::Tensor& flat, size_t i) const {
  return flat.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes());
}

}  // namespace loom::parallel
