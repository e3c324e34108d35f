#include "loom/train/gradient_syncs.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

#include "loom/dist/grad_reducer.h"
#include "loom/parallel/fsdp.h"
#include "loom/train/pipeline_placement.h"
#include "loom/train/sharded_adamw.h"
#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::train {

ComposedSync::ComposedSync(std::shared_ptr<dist::Comm> data,
                           std::map<std::string, parallel::ShardLayout> layouts,
                           std::vector<at::Tensor> trainable, std::vector<std::string> names)
    : data_(std::move(data)),
      layouts_(std::move(layouts)),
      trainable_(std::move(trainable)),
      names_(std::move(names)) {}

std::pair<size_t, double> ComposedSync::passes_and_total(size_t local, double count) {
  const bool paired = data_ && std::any_of(parts_.begin(), parts_.end(),
                                           [](const auto& part) { return part->pairs_passes(); });
  std::vector<double> counts{count};
  if (paired) {
    counts.resize(1 + static_cast<size_t>(data_->size()), 0.0);
    counts[1 + static_cast<size_t>(data_->rank())] = static_cast<double>(local);
  }
  if (data_) {
    auto t = at::tensor(counts, at::kDouble);
    data_->all_reduce_sum({t});
    counts.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  if (!paired) return {local, counts[0]};
  std::vector<int64_t> per_rank;
  for (size_t r = 1; r < counts.size(); ++r) per_rank.push_back(static_cast<int64_t>(counts[r]));
  for (const auto& part : parts_) part->check_passes(per_rank);
  const int64_t most = *std::max_element(per_rank.begin(), per_rank.end());
  return {std::max(local, static_cast<size_t>(most)), counts[0]};
}

void ComposedSync::begin_pass() {
  for (const auto& part : parts_) part->begin_pass();
}

double ComposedSync::end_pass() {
  double waited = 0.0;
  for (const auto& part : parts_) waited += part->end_pass();
  return waited;
}

void ComposedSync::before_backward(bool last) {
  for (const auto& part : parts_) part->before_backward(last);
}

double ComposedSync::reduce() {
  if (!data_) return 0.0;
  double waited = 0.0;
  for (const auto& part : parts_) waited += part->reduce();
  return waited;
}

double ComposedSync::clip(double max_norm) {
  double square = 0.0;
  for (const auto& part : parts_) square += part->gradient_square();
  const double norm = std::sqrt(square);
  for (const auto& part : parts_) part->clip_to(norm, max_norm);
  return norm;
}

void ComposedSync::gather_parameters() {
  for (const auto& part : parts_) part->gather();
}

void ComposedSync::release_parameters() {
  for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) (*it)->release();
}

void ComposedSync::reshard_from_parameters() {
  for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) (*it)->reshard();
}

std::vector<std::pair<std::string, at::Tensor>> ComposedSync::whole_gradients() const {
  std::vector<std::pair<std::string, at::Tensor>> grads;
  for (size_t i = 0; i < trainable_.size(); ++i) {
    at::Tensor g = trainable_[i].grad();
    if (!g.defined()) g = at::zeros_like(trainable_[i]);
    auto it = layouts_.find(names_[i]);
    grads.emplace_back(names_[i], it == layouts_.end() ? g : it->second.gather(g));
  }
  return grads;
}

std::string ComposedSync::summary(double waited_s, double step_s) const {
  for (const auto& part : parts_)
    if (std::string line = part->summary(waited_s, step_s); !line.empty()) return line;
  return "";
}

AllReduceGradients::AllReduceGradients(int64_t bucket_mb, bool overlap)
    : bucket_mb_(bucket_mb), overlap_(overlap) {}

AllReduceGradients::~AllReduceGradients() = default;

void AllReduceGradients::add_group(std::shared_ptr<dist::Comm> group, std::vector<at::Tensor> params,
                                   std::string what) {
  reducers_.push_back(
      std::make_unique<dist::GradReducer>(std::move(group), std::move(params), bucket_mb_ << 20, overlap_));
  names_.push_back(std::move(what));
}

void AllReduceGradients::before_backward(bool last) {
  // Only the last micro-batch's backward communicates: earlier ones only accumulate.
  if (last)
    for (auto& reducer : reducers_) reducer->arm();
}

double AllReduceGradients::reduce() {
  // Each rank holds its share's part of the global mean's gradient: their sum is the gradient.
  double waited = 0.0;
  for (auto& reducer : reducers_) waited += reducer->finish();
  return waited;
}

std::string AllReduceGradients::summary(double waited_s, double step_s) const {
  if (reducers_.empty()) return "";
  int64_t buckets = 0, started = 0;
  for (const auto& reducer : reducers_) {
    buckets += reducer->bucket_count();
    started += reducer->started_in_backward();
  }
  std::string groups;
  for (const std::string& name : names_)
    if (!name.empty()) groups += fmt::format(", the {}' over the expert-data group", name);
  return fmt::format(
      "gradient all-reduce: {:.3f} s waited after backward in {:.1f} s of steps ({} buckets of up to {} "
      "MiB{}, overlap {}; last step: {} started during backward)",
      waited_s, step_s, buckets, bucket_mb_, groups, overlap_ ? "on" : "off", started);
}

double WholeGradientNorm::gradient_square() {
  return train::gradient_square(params_, shares_, pipeline_.get());
}

void WholeGradientNorm::clip_to(double norm, double max_norm) { clip_gradients_to(params_, norm, max_norm); }

double Zero1Gradients::reduce() {
  const auto begin = Clock::now();
  for (auto& group : groups_) group->reduce_scatter_gradients();
  return seconds_since(begin);
}

double Zero1Gradients::gradient_square() {
  double square = 0.0;
  for (auto& group : groups_) square += group->gradient_square();
  return square;
}

void Zero1Gradients::clip_to(double norm, double max_norm) {
  for (auto& group : groups_) group->clip_to(norm, max_norm);
}

std::string Zero1Gradients::summary(double waited_s, double step_s) const {
  return fmt::format("gradient reduce-scatter (ZeRO-1): {:.3f} s after backward in {:.1f} s of steps",
                     waited_s, step_s);
}

void FsdpGradients::begin_pass() {
  if (pipeline_)
    fsdp_->begin_gathered_pass();
  else
    fsdp_->begin_pass();
}

double FsdpGradients::end_pass() {
  if (!pipeline_) return fsdp_->end_pass();
  pipeline_->sum_shared_gradients();  // whole, before they are sharded
  return fsdp_->end_gathered_pass();
}

double FsdpGradients::gradient_square() { return optimizer_->gradient_square(); }

void FsdpGradients::clip_to(double norm, double max_norm) { optimizer_->clip_to(norm, max_norm); }

void FsdpGradients::gather() { fsdp_->gather_all(); }

void FsdpGradients::release() { fsdp_->release_all(); }

void FsdpGradients::reshard() { fsdp_->reshard_from_parameters(); }

std::string FsdpGradients::summary(double waited_s, double step_s) const {
  return fmt::format(
      "FSDP: {:.3f} s waited for gathers and reduce-scatters at the end of passes in {:.1f} s of steps; "
      "model state per rank {} bytes between steps, peak during passes {} bytes more (gathered "
      "parameters, unreduced gradients, reduce-scatter buffers)",
      waited_s, step_s, state_bytes_, fsdp_->peak_transient_bytes());
}

double TensorParallelSums::reduce() {
  const auto begin = Clock::now();
  if (fsdp_)
    sum_shards();
  else
    sum_gradients();
  return seconds_since(begin);
}

// Replicated kv slices: every rank adds its part at its slice's place in a whole-size buffer, and
// the sum over the group holds every slice's.
void TensorParallelSums::sum_gradients() {
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < trainable_.size(); ++i)
    if (partial_.count(names_[i]) && trainable_[i].grad().defined()) grads.push_back(trainable_[i].grad());
  std::vector<std::pair<size_t, at::Tensor>> wholes;  // (trainable index, whole-size buffer)
  for (size_t i = 0; i < trainable_.size(); ++i) {
    auto it = replicated_.find(names_[i]);
    if (it == replicated_.end()) continue;
    const at::Tensor& p = trainable_[i];
    const parallel::ShardLayout& layout = it->second;
    at::Tensor whole = at::zeros(layout.whole_shape(p.sizes()), p.options());
    if (p.grad().defined())
      whole.narrow(layout.dim, layout.chunk * p.size(layout.dim), p.size(layout.dim)).copy_(p.grad());
    grads.push_back(whole);
    wholes.emplace_back(i, whole);
  }
  tp_->all_reduce_sum(grads);
  for (const auto& [i, whole] : wholes) {
    at::Tensor& p = trainable_[i];
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    p.mutable_grad().copy_(replicated_.at(names_[i]).slice(whole));
  }
}

// A parameter's part of an FSDP slice is at the same place on each rank of the tensor-parallel group;
// a replicated kv slice's part goes at its chunk's place in a buffer of every chunk's.
void TensorParallelSums::sum_shards() {
  std::vector<at::Tensor> sums;
  std::vector<std::tuple<at::Tensor, at::Tensor, int64_t>> replicated;  // (slice part, buffer, offset)
  for (const auto& shard : fsdp_->shards())
    for (size_t i = 0; i < shard->params().size(); ++i) {
      const auto o = shard->overlap(i);
      if (o.length == 0) continue;
      at::Tensor part = shard->grad.narrow(0, o.in_slice, o.length);
      const std::string& name = shard->names()[i];
      if (partial_.count(name)) {
        sums.push_back(part);
      } else if (auto it = replicated_.find(name); it != replicated_.end()) {
        at::Tensor buffer = at::zeros({it->second.chunks * o.length}, part.options());
        buffer.narrow(0, it->second.chunk * o.length, o.length).copy_(part);
        sums.push_back(buffer);
        replicated.emplace_back(part, buffer, it->second.chunk * o.length);
      }
    }
  tp_->all_reduce_sum(sums);
  for (auto& [part, buffer, offset] : replicated) part.copy_(buffer.narrow(0, offset, part.numel()));
}

void PipelineGradients::check_passes(const std::vector<int64_t>& per_rank) const {
  if (interleave_group_ <= 1) return;
  for (size_t r = 0; r < per_rank.size(); ++r)
    if (per_rank[r] % interleave_group_ != 0)
      throw ConfigError(fmt::format(
          "parallel.virtual_stages: the interleaved schedule takes micro-batches in groups of "
          "parallel.pp={}, "
          "and data rank {} has {} this step (samples dropped or packed into fewer micro-batches; use "
          "virtual_stages 1, or a batch whose micro-batches are always a multiple of pp)",
          interleave_group_, r, per_rank[r]));
}

double PipelineGradients::reduce() {
  const auto begin = Clock::now();
  if (sum_after_passes_) pipeline_->sum_shared_gradients();  // a tied embedding's two stages
  return seconds_since(begin);
}

void PipelineGradients::gather() { pipeline_->gather(); }

void PipelineGradients::release() { pipeline_->release(); }

void ExpertSlices::check_passes(const std::vector<int64_t>& per_rank) const {
  for (size_t r = 1; r < per_rank.size(); ++r)
    if (per_rank[r] != per_rank[0])
      throw ConfigError(fmt::format(
          "parallel.ep={}: every pass exchanges tokens between the data ranks, and this step data rank 0 has "
          "{} micro-batches and rank {} has {} (samples dropped or packed into fewer micro-batches; use a "
          "data set and batch whose micro-batches are the same on every rank)",
          ep_, per_rank[0], r, per_rank[r]));
}

void ExpertSlices::gather() {
  at::NoGradGuard no_grad;
  for (Expert& e : experts_) {
    e.local = e.param.data();
    e.param.set_data(e.layout.gather(e.local));
  }
}

void ExpertSlices::release() {
  for (Expert& e : experts_) {
    e.param.set_data(e.local);
    e.local = at::Tensor();
  }
}

void ExpertSlices::reshard() {
  // Each slice back in its parameter, for the parts before this one (FSDP) to reshard from.
  at::NoGradGuard no_grad;
  for (Expert& e : experts_)
    if (e.local.defined()) {
      e.local.copy_(e.layout.slice(e.param.data()));
      e.param.set_data(e.local);
    }
}

}  // namespace loom::train
