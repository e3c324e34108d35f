#include "loom/train/sharded_adamw.h"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "loom/util/errors.h"

namespace loom::train {

ShardedAdamW::ShardedAdamW(std::shared_ptr<dist::Comm> comm, std::vector<NamedParam> params,
                           AdamWOptions options)
    : comm_(std::move(comm)), params_(std::move(params)), options_(options) {
  AdamW::check(params_, options);
  at::NoGradGuard no_grad;
  int64_t total = 0;
  for (const auto& p : params_) {
    offsets_.push_back(total);
    total += p.param.numel();
  }
  const int64_t ranks = comm_->size();
  slice_ = (total + ranks - 1) / ranks;
  begin_ = comm_->rank() * slice_;
  master_ = at::zeros({slice_}, at::kFloat);
  decays_ = at::zeros({slice_}, at::kBool);
  // Each parameter's overlap with this rank's slice [begin_, begin_ + slice_).
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t start = std::max(offsets_[i], begin_);
    const int64_t end = std::min(offsets_[i] + params_[i].param.numel(), begin_ + slice_);
    if (start >= end) continue;
    master_.narrow(0, start - begin_, end - start)
        .copy_(params_[i].param.detach().reshape({-1}).narrow(0, start - offsets_[i], end - start));
    if (AdamW::decays(params_[i])) decays_.narrow(0, start - begin_, end - start).fill_(true);
  }
  exp_avg_ = at::zeros({slice_}, at::kFloat);
  exp_avg_sq_ = at::zeros({slice_}, at::kFloat);
  grad_ = at::zeros({slice_}, at::kFloat);
}

double ShardedAdamW::reduce_gradients(double max_norm) {
  at::NoGradGuard no_grad;
  at::Tensor flat = at::zeros({slice_ * comm_->size()}, at::kFloat);
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& g = params_[i].param.grad();
    if (g.defined()) flat.narrow(0, offsets_[i], g.numel()).copy_(g.reshape({-1}));
  }
  comm_->reduce_scatter_sum(flat, grad_);
  at::Tensor square = grad_.to(at::kDouble).pow(2).sum().reshape({1});
  comm_->all_reduce_sum({square});
  const double norm = std::sqrt(square.item<double>());
  // The same rule as clip_grad_norm for an unsharded step.
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) grad_.mul_(max_norm / (norm + 1e-6));
  return norm;
}

void ShardedAdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_;
  // AdamW::step's arithmetic, element for element, on this rank's slice.
  if (options_.weight_decay != 0.0) {
    const at::Tensor decayed = master_ * (1.0 - lr * options_.weight_decay);
    master_ = at::where(decays_, decayed, master_);
  }
  adam_update(master_, grad_, exp_avg_, exp_avg_sq_, lr, step_, options_);

  const at::Tensor weights = gather(master_);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].param;
    p.copy_(weights.narrow(0, offsets_[i], p.numel()).view_as(p));  // rounds into bf16 parameters
  }
}

void ShardedAdamW::zero_grad() {
  for (auto& p : params_) p.param.mutable_grad() = at::Tensor();
}

at::Tensor ShardedAdamW::gather(const at::Tensor& slice) const {
  at::Tensor whole = at::empty({slice_ * comm_->size()}, slice.options());
  comm_->all_gather_flat(slice, whole);
  return whole;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedAdamW::state_dict() const {
  const at::Tensor m = gather(exp_avg_), v = gather(exp_avg_sq_), w = gather(master_);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const NamedParam& p = params_[i];
    auto whole = [&](const at::Tensor& flat) {
      return flat.narrow(0, offsets_[i], p.param.numel()).view_as(p.param);
    };
    out.emplace_back("exp_avg." + p.name, whole(m));
    out.emplace_back("exp_avg_sq." + p.name, whole(v));
    if (p.param.scalar_type() == at::kBFloat16) out.emplace_back("master." + p.name, whole(w));
  }
  out.emplace_back("step", at::scalar_tensor(step_, at::kLong));
  return out;
}

void ShardedAdamW::load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  // AdamW checks every entry (names, shapes, nothing missing or extra) and holds the whole state
  // for as long as this takes its slice.
  AdamW whole(params_, options_);
  whole.load_state_dict(state);
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> by_key;
  for (auto& [key, value] : whole.state_dict()) by_key.emplace(key, value);
  for (size_t i = 0; i < params_.size(); ++i) {
    const NamedParam& p = params_[i];
    const int64_t start = std::max(offsets_[i], begin_);
    const int64_t end = std::min(offsets_[i] + p.param.numel(), begin_ + slice_);
    if (start >= end) continue;
    auto take = [&](at::Tensor& slice, const at::Tensor& source) {
      slice.narrow(0, start - begin_, end - start)
          .copy_(source.reshape({-1}).narrow(0, start - offsets_[i], end - start));
    };
    take(exp_avg_, by_key.at("exp_avg." + p.name));
    take(exp_avg_sq_, by_key.at("exp_avg_sq." + p.name));
    const auto master = by_key.find("master." + p.name);
    take(master_, master != by_key.end() ? master->second : p.param.detach().to(at::kFloat));
  }
  step_ = whole.step_count();
}

int64_t ShardedAdamW::state_bytes() const {
  return master_.nbytes() + exp_avg_.nbytes() + exp_avg_sq_.nbytes();
}

}  // namespace loom::train
