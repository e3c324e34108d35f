#include "loom/train/sharded_adamw.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "loom/util/errors.h"

namespace loom::train {

ShardedAdamW::ShardedAdamW(std::shared_ptr<dist::Comm> comm, std::vector<NamedParam> params,
                           AdamWOptions options)
    : comm_(std::move(comm)), zero1_(true), options_(options) {
  AdamW::check(params, options);
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  for (auto& p : params) {
    names.push_back(p.name);
    tensors.push_back(p.param);
  }
  add(std::make_shared<parallel::FlatShard>(std::move(names), std::move(tensors), comm_->rank(),
                                            comm_->size()));
  if (split()) {
    for (const auto& p : params)
      if (p.param.scalar_type() != at::kBFloat16)
        throw ModelError(fmt::format("sharded AdamW: split masters need bf16 parameters; '{}' is {}", p.name,
                                     c10::toString(p.param.scalar_type())));
    for (Slot& s : slots_) split_master(s, s.shard->master);  // the parameters themselves: residual 0
  }
}

at::Tensor ShardedAdamW::joined_master(const Slot& s) const {
  at::Tensor high = at::zeros({s.shard->slice_numel()}, at::kFloat);
  std::vector<at::Tensor> params;
  for (const auto& p : s.shard->params()) params.push_back(p.detach());
  s.shard->take_slice(params, high);  // bf16 values, exact in fp32
  return memory::join_master(high.to(at::kBFloat16), s.split);
}

void ShardedAdamW::split_master(Slot& s, const at::Tensor& master) {
  at::Tensor high = at::empty({master.numel()}, at::kBFloat16);
  s.split = memory::split_master(master, high);
  s.shard->master = at::Tensor();
}

ShardedAdamW::ShardedAdamW(std::shared_ptr<dist::Comm> comm,
                           std::vector<std::shared_ptr<parallel::FlatShard>> shards, AdamWOptions options)
    : comm_(std::move(comm)), options_(options) {
  std::vector<NamedParam> all;
  for (const auto& shard : shards)
    for (const auto& p : named(*shard)) all.push_back(p);
  AdamW::check(all, options);
  for (auto& shard : shards) add(std::move(shard));
}

void ShardedAdamW::add(std::shared_ptr<parallel::FlatShard> shard) {
  if (shard->ranks() != comm_->size() || shard->rank() != comm_->rank())
    throw ModelError(fmt::format("sharded AdamW: a shard laid out for rank {} of {} on rank {} of {}",
                                 shard->rank(), shard->ranks(), comm_->rank(), comm_->size()));
  Slot slot;
  const int64_t slice = shard->slice_numel();
  const auto on = at::TensorOptions().device(shard->device());
  slot.exp_avg = at::zeros({slice}, on.dtype(at::kFloat));
  slot.exp_avg_sq = at::zeros({slice}, on.dtype(at::kFloat));
  slot.decays = at::zeros({slice}, on.dtype(at::kBool));
  const auto params = named(*shard);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto o = shard->overlap(i);
    if (o.length > 0 && AdamW::decays(params[i])) slot.decays.narrow(0, o.in_slice, o.length).fill_(true);
  }
  slot.shard = std::move(shard);
  slots_.push_back(std::move(slot));
}

std::vector<NamedParam> ShardedAdamW::named(const parallel::FlatShard& shard) const {
  std::vector<NamedParam> out;
  for (size_t i = 0; i < shard.params().size(); ++i) out.push_back({shard.names()[i], shard.params()[i]});
  return out;
}

double ShardedAdamW::reduce_gradients(double max_norm) {
  reduce_scatter_gradients();
  return clip_gradients(max_norm);
}

void ShardedAdamW::reduce_scatter_gradients() {
  if (!zero1_) throw ModelError("sharded AdamW: FSDP reduces the gradients itself");
  at::NoGradGuard no_grad;
  parallel::FlatShard& shard = *slots_.front().shard;
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < shard.params().size(); ++i) {
    grads.push_back(shard.params()[i].grad());
    shard.has_grad[i] = grads.back().defined();
  }
  comm_->reduce_scatter_sum(shard.flatten(grads, at::kFloat), shard.grad);
}

void ShardedAdamW::set_tensor_parallel(std::shared_ptr<dist::Comm> tp, std::map<std::string, double> share) {
  tp_ = std::move(tp);
  tp_share_ = std::move(share);
}

void ShardedAdamW::set_pipeline(std::shared_ptr<dist::Comm> pipeline, std::set<std::string> uncounted) {
  pipeline_ = std::move(pipeline);
  uncounted_ = std::move(uncounted);
}

double ShardedAdamW::clip_gradients(double max_norm) {
  const double norm = std::sqrt(gradient_square());
  clip_to(norm, max_norm);
  return norm;
}

double ShardedAdamW::gradient_square() {
  at::NoGradGuard no_grad;
  // One message: the squared norm of this rank's slices (under tensor parallelism, of the whole
  // parameters' and of the tensor-parallel slices' elements apart), then which parameters got a
  // gradient here.
  const at::Device device = slots_.empty() ? at::Device(at::kCPU) : slots_.front().shard->device();
  at::Tensor square = at::zeros({tp_ ? 2 : 1}, at::TensorOptions(at::kDouble).device(device));
  std::vector<double> flags;
  for (const Slot& s : slots_) {
    if (!tp_ && uncounted_.empty()) {
      square += s.shard->grad.to(at::kDouble).pow(2).sum();
    } else {
      const parallel::FlatShard& shard = *s.shard;
      for (size_t i = 0; i < shard.params().size(); ++i) {
        const auto o = shard.overlap(i);
        if (o.length == 0 || uncounted_.count(shard.names()[i])) continue;
        const at::Tensor part = shard.grad.narrow(0, o.in_slice, o.length).to(at::kDouble).pow(2).sum();
        const auto it = tp_share_.find(shard.names()[i]);
        const double share = !tp_ || it == tp_share_.end() ? 0.0 : it->second;
        if (share == 0.0)
          square[0] += part;
        else
          square[1] += part * share;
      }
    }
    flags.insert(flags.end(), s.shard->has_grad.begin(), s.shard->has_grad.end());
  }
  // On the CPU: the flags are read here, and the sum is a few numbers.
  at::Tensor totals = at::cat({square.to(at::kCPU), at::tensor(flags, at::kDouble)});
  comm_->all_reduce_sum({totals});
  const double* summed = totals.data_ptr<double>();
  double norm_squared = summed[0];
  if (tp_) {
    // The slices' squares differ over the tensor-parallel ranks; the whole parameters' are the same.
    at::Tensor slices = totals.narrow(0, 1, 1).clone();
    tp_->all_reduce_sum({slices});
    norm_squared += slices.item<double>();
  }
  if (pipeline_) {  // each stage's parameters' squares
    at::Tensor stages = at::tensor({norm_squared}, at::kDouble);
    pipeline_->all_reduce_sum({stages});
    norm_squared = stages.item<double>();
  }
  size_t k = tp_ ? 2 : 1;
  for (Slot& s : slots_) {
    const parallel::FlatShard& shard = *s.shard;
    std::vector<size_t> missing;
    for (size_t i = 0; i < shard.params().size(); ++i, ++k)
      if (summed[k] == 0.0) missing.push_back(i);
    s.updates = at::Tensor();
    if (missing.empty()) continue;
    s.updates = at::ones({shard.slice_numel()}, at::TensorOptions(at::kBool).device(shard.device()));
    for (size_t i : missing) {
      const auto o = shard.overlap(i);
      if (o.length > 0) s.updates.narrow(0, o.in_slice, o.length).fill_(false);
    }
  }
  return norm_squared;
}

void ShardedAdamW::clip_to(double norm, double max_norm) {
  at::NoGradGuard no_grad;
  // The same rule as clip_grad_norm for an unsharded step.
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm)
    for (Slot& s : slots_) s.shard->grad.mul_(max_norm / (norm + 1e-6));
}

void ShardedAdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_;
  for (Slot& s : slots_) {
    if (split()) s.shard->master = joined_master(s);
    at::Tensor& master = s.shard->master;
    // Parameters no rank gave a gradient keep their weights and moments.
    at::Tensor kept_master, kept_avg, kept_avg_sq;
    if (s.updates.defined()) {
      kept_master = master.clone();
      kept_avg = s.exp_avg.clone();
      kept_avg_sq = s.exp_avg_sq.clone();
    }
    // AdamW::step's arithmetic, element for element, on this rank's slice.
    if (options_.weight_decay != 0.0) {
      const at::Tensor decayed = master * (1.0 - lr * options_.weight_decay);
      master.copy_(at::where(s.decays, decayed, master));
    }
    adam_update(master, s.shard->grad, s.exp_avg, s.exp_avg_sq, lr, step_, options_);
    if (s.updates.defined()) {
      master.copy_(at::where(s.updates, master, kept_master));
      s.exp_avg.copy_(at::where(s.updates, s.exp_avg, kept_avg));
      s.exp_avg_sq.copy_(at::where(s.updates, s.exp_avg_sq, kept_avg_sq));
    }
  }
  if (!zero1_) return;
  const parallel::FlatShard& shard = *slots_.front().shard;
  const at::Tensor weights = gather(shard.master);
  for (size_t i = 0; i < shard.params().size(); ++i) {
    at::Tensor p = shard.params()[i];
    p.copy_(shard.unflatten(weights, i));  // rounds into bf16 parameters
  }
  if (split()) split_master(slots_.front(), shard.master);
}

void ShardedAdamW::zero_grad() {
  for (Slot& s : slots_) {
    s.shard->grad.zero_();
    std::fill(s.shard->has_grad.begin(), s.shard->has_grad.end(), false);
    if (!zero1_) continue;
    for (at::Tensor p : s.shard->params()) p.mutable_grad() = at::Tensor();
  }
}

at::Tensor ShardedAdamW::gather(const at::Tensor& slice) const {
  at::Tensor whole = at::empty({slice.numel() * comm_->size()}, slice.options());
  comm_->all_gather_flat(slice, whole);
  return whole;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedAdamW::state_dict() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const Slot& s : slots_) {
    const parallel::FlatShard& shard = *s.shard;
    const at::Tensor m = gather(s.exp_avg), v = gather(s.exp_avg_sq),
                     w = gather(split() ? joined_master(s) : shard.master);
    for (size_t i = 0; i < shard.params().size(); ++i) {
      const std::string& name = shard.names()[i];
      out.emplace_back("exp_avg." + name, shard.unflatten(m, i));
      out.emplace_back("exp_avg_sq." + name, shard.unflatten(v, i));
      if (shard.params()[i].scalar_type() == at::kBFloat16)
        out.emplace_back("master." + name, shard.unflatten(w, i));
    }
  }
  out.emplace_back("step", at::scalar_tensor(step_, at::kLong));
  return out;
}

void ShardedAdamW::load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::vector<NamedParam> all;
  for (const Slot& s : slots_)
    for (const auto& p : named(*s.shard)) all.push_back(p);
  const auto checked = checked_adamw_state(all, state);
  at::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    parallel::FlatShard& shard = *s.shard;
    std::vector<at::Tensor> m, v, w;
    for (size_t i = 0; i < shard.params().size(); ++i) {
      const std::string& name = shard.names()[i];
      const at::Tensor& p = shard.params()[i];
      m.push_back(checked.at("exp_avg." + name));
      v.push_back(checked.at("exp_avg_sq." + name));
      if (p.scalar_type() == at::kBFloat16) {
        w.push_back(checked.at("master." + name));
      } else {
        w.push_back(zero1_ ? p.detach() : at::Tensor());  // FSDP: the shard already holds the weights
      }
    }
    shard.take_slice(m, s.exp_avg);
    shard.take_slice(v, s.exp_avg_sq);
    if (split()) {
      // The parameters were loaded from the same checkpoint: they are the master's rounding.
      at::Tensor master = at::zeros({shard.slice_numel()}, at::kFloat);
      shard.take_slice(w, master);
      split_master(s, master);
    } else {
      shard.take_slice(w, shard.master);
    }
  }
  step_ = checked.at("step").item<int64_t>();
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const Slot& s : slots_)
    bytes += (split() ? s.split.bytes() : static_cast<int64_t>(s.shard->master.nbytes())) +
             s.exp_avg.nbytes() + s.exp_avg_sq.nbytes();
  return bytes;
}

}  // namespace loom::train
