#include "loom/dist/grad_reducer.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "loom/dist/gradient_ready_hook.h"
#include "loom/util/errors.h"

namespace loom::dist {
namespace {

// bf16 and half gradients are summed in fp32 (Comm::all_reduce_sum's rule on the CPU).
at::ScalarType wire_dtype(at::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kHalf ? at::kFloat : dtype;
}

}  // namespace

GradReducer::GradReducer(std::shared_ptr<Comm> comm, std::vector<at::Tensor> params, int64_t bucket_bytes,
                         bool overlap)
    : comm_(std::move(comm)), params_(std::move(params)), overlap_(overlap) {
  if (bucket_bytes <= 0)
    throw ConfigError(fmt::format("gradient bucket size must be > 0, got {}", bucket_bytes));
  bucket_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  has_grad_.assign(params_.size(), false);
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    const at::ScalarType wire = wire_dtype(p.scalar_type());
    const int64_t size = p.numel() * static_cast<int64_t>(c10::elementSize(wire));
    if (buckets_.empty() || buckets_.back().wire != wire || (bytes > 0 && bytes + size > bucket_bytes)) {
      buckets_.emplace_back();
      buckets_.back().wire = wire;
      bytes = 0;
    }
    Bucket& bucket = buckets_.back();
    bucket_of_[k] = buckets_.size() - 1;
    bucket.params.push_back(k);
    bucket.numel += p.numel();
    bytes += size;
  }
  for (Bucket& bucket : buckets_) {
    bucket.flat =
        at::empty({bucket.numel},
                  at::TensorOptions().dtype(bucket.wire).device(params_[bucket.params.front()].device()));
    bucket.waiting = static_cast<int64_t>(bucket.params.size());
  }
  if (!overlap_) return;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].requires_grad() || !params_[k].is_leaf())
      throw ConfigError("gradient reduction needs leaf parameters that require grad");
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[k]);
    hook_keys_.push_back(
        accumulator->add_post_hook(std::make_unique<GradientReadyHook>([this, k] { on_gradient_ready(k); })));
    accumulators_.push_back(std::move(accumulator));
  }
}

GradReducer::~GradReducer() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

void GradReducer::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = overlap_;
  started_in_backward_ = 0;
}

void GradReducer::on_gradient_ready(size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_ || ready_[param]) return;
  ready_[param] = true;
  --buckets_[bucket_of_[param]].waiting;
  const size_t before = next_;
  start_ready_buckets();
  started_in_backward_ += static_cast<int64_t>(next_ - before);
}

void GradReducer::start_ready_buckets() {
  while (next_ < buckets_.size() && buckets_[next_].waiting == 0) {
    start(buckets_[next_]);
    ++next_;  // only once it has started
  }
}

void GradReducer::start(Bucket& bucket) {
  int64_t offset = 0;
  for (size_t k : bucket.params) {
    at::Tensor& p = params_[k];
    has_grad_[k] = p.grad().defined();
    if (!has_grad_[k]) p.mutable_grad() = at::zeros_like(p);  // unused on this rank
    bucket.flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape({-1}));
    offset += p.numel();
  }
  bucket.work = comm_->start_all_reduce_sum(bucket.flat);
}

double GradReducer::finish() {
  const auto begin = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  for (; next_ < buckets_.size(); ++next_) start(buckets_[next_]);
  for (Bucket& bucket : buckets_) {
    bucket.work->wait();
    bucket.work.reset();
    int64_t offset = 0;
    for (size_t k : bucket.params) {
      at::Tensor& p = params_[k];
      p.mutable_grad().copy_(bucket.flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  // A parameter no rank gave a gradient to (a vision tower no rank's samples used) has none, as in
  // one process, so the optimizer leaves it alone instead of stepping on a zero gradient.
  std::vector<float> flags(has_grad_.begin(), has_grad_.end());
  at::Tensor counts = at::tensor(flags, at::kFloat);
  comm_->start_all_reduce_sum(counts)->wait();
  const float* summed = counts.data_ptr<float>();
  for (size_t k = 0; k < params_.size(); ++k)
    if (summed[k] == 0.0F) params_[k].mutable_grad() = at::Tensor();
  reset();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

void GradReducer::reset() {
  next_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  for (Bucket& bucket : buckets_) bucket.waiting = static_cast<int64_t>(bucket.params.size());
}

}  // namespace loom::dist
