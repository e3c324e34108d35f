#include "loom/train/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <tuple>

#include "loom/core/device.h"
#include "loom/dist/grad_reducer.h"
#include "loom/memory/recompute.h"
#include "loom/parallel/fsdp.h"
#include "loom/parallel/pipeline/exchange.h"
#include "loom/parallel/tensor.h"
#include "loom/train/pipeline_placement.h"
#include "loom/train/schedule.h"
#include "loom/train/sharded_adamw.h"
#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::train {
namespace {

// Optimizer state entries are "<kind>.<parameter name>" (and "step"): under tensor parallelism
// each is cut like its parameter. Whole entries from this rank's slices (a collective over the
// tensor-parallel group), or this rank's slices from whole entries.
std::vector<std::pair<std::string, at::Tensor>> tensor_parallel_state(
    const std::map<std::string, parallel::ShardLayout>& layouts,
    std::vector<std::pair<std::string, at::Tensor>> state, bool gather) {
  for (auto& [key, value] : state) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos) continue;
    auto it = layouts.find(key.substr(dot + 1));
    if (it == layouts.end() || !it->second.split()) continue;
    value = gather ? it->second.gather(value) : it->second.slice(value);
  }
  return state;
}

// AdamW over whole parameters or their tensor-parallel slices.
class WholeAdamW : public Optimizer {
 public:
  WholeAdamW(std::vector<NamedParam> params, AdamWOptions options,
             const std::map<std::string, parallel::ShardLayout>* tp_layouts)
      : adamw_(std::move(params), options), tp_layouts_(tp_layouts) {}
  void step(double lr) override {
    adamw_.step(lr);
    adamw_.zero_grad();
  }
  void skip_step() override { adamw_.zero_grad(); }
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const override {
    auto state = adamw_.state_dict();
    return tp_layouts_ ? tensor_parallel_state(*tp_layouts_, std::move(state), /*gather=*/true) : state;
  }
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) override {
    adamw_.load_state_dict(tp_layouts_ ? tensor_parallel_state(*tp_layouts_, state, /*gather=*/false)
                                       : state);
  }
  int64_t state_bytes() const { return adamw_.state_bytes(); }

 private:
  AdamW adamw_;
  const std::map<std::string, parallel::ShardLayout>* tp_layouts_;  // null: no parameter is split over ranks
};

// ZeRO-1 or FSDP: each rank updates its slices (of its tensor-parallel slices, under tensor
// parallelism).
class ShardedOptimizer : public Optimizer {
 public:
  ShardedOptimizer(std::shared_ptr<ShardedAdamW> sharded,
                   const std::map<std::string, parallel::ShardLayout>* tp_layouts)
      : sharded_(std::move(sharded)), tp_layouts_(tp_layouts) {}
  void step(double lr) override {
    sharded_->step(lr);
    sharded_->zero_grad();
  }
  void skip_step() override { sharded_->zero_grad(); }
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const override {
    auto state = sharded_->state_dict();
    return tp_layouts_ ? tensor_parallel_state(*tp_layouts_, std::move(state), /*gather=*/true) : state;
  }
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) override {
    sharded_->load_state_dict(tp_layouts_ ? tensor_parallel_state(*tp_layouts_, state, /*gather=*/false)
                                          : state);
  }

 private:
  std::shared_ptr<ShardedAdamW> sharded_;
  const std::map<std::string, parallel::ShardLayout>* tp_layouts_;  // null: no parameter is split over ranks
};

// Optimizers over disjoint sets of parameters (each gradient group's), as one: a checkpoint's state
// holds every part's entries (and "step" once), each part loads its own parameters' entries.
class GroupedOptimizer : public Optimizer {
 public:
  struct Part {
    std::unique_ptr<Optimizer> optimizer;
    std::set<std::string> names;  // its parameters
  };
  explicit GroupedOptimizer(std::vector<Part> parts) : parts_(std::move(parts)) {}
  void step(double lr) override {
    for (Part& part : parts_) part.optimizer->step(lr);
  }
  void skip_step() override {
    for (Part& part : parts_) part.optimizer->skip_step();
  }
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const override {
    std::vector<std::pair<std::string, at::Tensor>> state;
    for (const Part& part : parts_)
      for (auto& entry : part.optimizer->state_dict())
        if (entry.first != "step" || &part == &parts_.front()) state.push_back(std::move(entry));
    return state;
  }
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) override {
    std::vector<std::vector<std::pair<std::string, at::Tensor>>> shares(parts_.size());
    for (const auto& [key, value] : state) {
      const size_t dot = key.find('.');
      bool placed = false;
      for (size_t i = 0; i < parts_.size(); ++i)
        if (key == "step" || (dot != std::string::npos && parts_[i].names.count(key.substr(dot + 1)))) {
          shares[i].emplace_back(key, value);
          placed = true;
        }
      if (!placed)
        throw CheckpointError(fmt::format(
            "optimizer state: unexpected entry '{}' (no parameter of that name in this optimizer)", key));
    }
    for (size_t i = 0; i < parts_.size(); ++i) parts_[i].optimizer->load_state_dict(shares[i]);
  }

 private:
  std::vector<Part> parts_;
};

// Every layout's gradient sums in one object: over each parameter's gradient group (the data group;
// experts under expert parallelism, the expert-data group) one of the bucketed all-reduce
// (reducers, one per group), ZeRO-1's reduce-scatter (sharded without fsdp) or FSDP's (fsdp); then
// over the tensor-parallel group the partial and replicated-slice sums.
class LayoutGradients : public GradientSync {
 public:
  std::shared_ptr<dist::Comm> data;  // null: one process
  std::shared_ptr<dist::Comm> tp;    // null: tp 1
  std::map<std::string, parallel::ShardLayout> layouts;
  std::vector<at::Tensor> trainable;
  std::vector<std::string> names;
  // The group parameters are split over (tp, or ep for experts; null: none), and each trainable
  // parameter's share of its squared gradient norm in the sum over it (0: whole on every rank,
  // counted once; 1: a slice; 1/n: a slice n ranks hold alike); empty when nothing is split.
  std::shared_ptr<dist::Comm> split;
  std::vector<double> split_share;
  // Expert parallelism beside tensor parallelism: the experts' shares over ep (split is then tp).
  std::vector<double> expert_share;
  std::shared_ptr<dist::Comm> ep;
  // By name: under sequence parallelism, whole parameters whose gradient is a partial sum over tp;
  // and the replicated kv slices whose gradient is a partial sum over the ranks holding them.
  std::set<std::string> partial_names;
  std::map<std::string, parallel::ShardLayout> replicated_layouts;
  // Bucketed all-reduce, one per gradient group that spans ranks (the data group's first).
  std::vector<std::unique_ptr<dist::GradReducer>> reducers;
  std::shared_ptr<parallel::FullyShardedModel> fsdp;
  std::shared_ptr<ShardedAdamW> sharded;
  // ZeRO-1 under expert parallelism: the experts' own, over the expert-data group (sharded is then
  // the other parameters', over the data group).
  std::shared_ptr<ShardedAdamW> expert_sharded;
  std::shared_ptr<PipelinePlacement> pipeline;  // null: pp 1
  // Expert parallelism: every expert parameter (trainable or not) with its layout, and while the
  // parameters are whole (evaluation, loading, saving), its own slice. Gathered whole, an expert
  // layer holds every expert and runs them on its own rank's tokens, so ranks may evaluate
  // different batches.
  struct SplitExpert {
    at::Tensor param;
    parallel::ShardLayout layout;
    at::Tensor local;
  };
  std::vector<SplitExpert> experts;
  std::vector<bool> counted;     // under pp: whether this rank counts trainable[i]'s norm
  int64_t interleave_group = 0;  // interleaved pipeline: the micro-batches come in groups of pp
  int64_t bucket_mb = 0;
  bool overlap = false;
  // Expert parallelism: every pass exchanges tokens with the other data ranks, so each makes the
  // same number of passes.
  int64_t expert_parallel = 1;

  std::pair<size_t, double> passes_and_total(size_t local, double count) override {
    std::vector<double> counts{count};
    if (fsdp || interleave_group > 1 || expert_parallel > 1) {
      counts.resize(1 + static_cast<size_t>(data->size()), 0.0);
      counts[1 + static_cast<size_t>(data->rank())] = static_cast<double>(local);
    }
    if (data) {
      auto t = at::tensor(counts, at::kDouble);
      data->all_reduce_sum({t});
      counts.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    }
    size_t passes = local;
    for (size_t r = 1; r < counts.size(); ++r) {
      passes = std::max(passes, static_cast<size_t>(counts[r]));
      // Every rank sees every count, so every rank refuses a step the interleaved order cannot take.
      if (interleave_group > 1 && static_cast<int64_t>(counts[r]) % interleave_group != 0)
        throw ConfigError(fmt::format(
            "parallel.virtual_stages: the interleaved schedule takes micro-batches in groups of "
            "parallel.pp={}, "
            "and data rank {} has {} this step (samples dropped or packed into fewer micro-batches; use "
            "virtual_stages 1, or a batch whose micro-batches are always a multiple of pp)",
            interleave_group, r - 1, static_cast<int64_t>(counts[r])));
      if (expert_parallel > 1 && static_cast<size_t>(counts[r]) != static_cast<size_t>(counts[1]))
        throw ConfigError(fmt::format(
            "parallel.ep={}: every pass exchanges tokens between the data ranks, and this step data rank 0 "
            "has {} micro-batches and rank {} has {} (samples dropped or packed into fewer micro-batches; "
            "use a data set and batch whose micro-batches are the same on every rank)",
            expert_parallel, static_cast<int64_t>(counts[1]), r - 1, static_cast<int64_t>(counts[r])));
    }
    return {passes, counts[0]};
  }
  // Under pipeline parallelism the schedule is one pass: FSDP gathers once and reduce-scatters once,
  // after the tied embedding's gradients are summed over its stages (whole, before they are sharded).
  void begin_pass() override {
    if (fsdp && pipeline)
      fsdp->begin_gathered_pass();
    else if (fsdp)
      fsdp->begin_pass();
  }
  double end_pass() override {
    if (fsdp && pipeline) {
      pipeline->sum_shared_gradients();
      return fsdp->end_gathered_pass();
    }
    return fsdp ? fsdp->end_pass() : 0.0;
  }
  void before_backward(bool last) override {
    // Only the last micro-batch's backward communicates: earlier ones only accumulate.
    if (last)
      for (auto& reducer : reducers) reducer->arm();
  }

  double reduce() override {
    if (!data) return 0.0;
    // Each rank holds its share's part of the global mean's gradient: their sum is the gradient.
    double waited = 0.0;
    for (auto& reducer : reducers) waited += reducer->finish();
    const auto begin = Clock::now();
    if (fsdp) {
      sum_tensor_parallel_shards();  // FSDP has reduce-scattered over the data-parallel ranks
    } else {
      sum_tensor_parallel_parts();
      if (pipeline) pipeline->sum_shared_gradients();    // a tied embedding's two stages
      if (sharded) sharded->reduce_scatter_gradients();  // ZeRO-1
      if (expert_sharded) expert_sharded->reduce_scatter_gradients();
    }
    return waited + seconds_since(begin);
  }

  // Sequence parallelism: each tensor-parallel rank holds part of the gradients of partial_names.
  // Replicated kv slices: each rank holding one has its query heads' part; every rank adds its part
  // at its slice's place in a whole-size buffer, and the sum over the group holds every slice's.
  void sum_tensor_parallel_parts() {
    if (partial_names.empty() && replicated_layouts.empty()) return;
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < trainable.size(); ++i)
      if (partial_names.count(names[i]) && trainable[i].grad().defined())
        grads.push_back(trainable[i].grad());
    std::vector<std::pair<size_t, at::Tensor>> wholes;  // (trainable index, whole-size buffer)
    for (size_t i = 0; i < trainable.size(); ++i) {
      auto it = replicated_layouts.find(names[i]);
      if (it == replicated_layouts.end()) continue;
      const at::Tensor& p = trainable[i];
      const parallel::ShardLayout& layout = it->second;
      at::Tensor whole = at::zeros(layout.whole_shape(p.sizes()), p.options());
      if (p.grad().defined())
        whole.narrow(layout.dim, layout.chunk * p.size(layout.dim), p.size(layout.dim)).copy_(p.grad());
      grads.push_back(whole);
      wholes.emplace_back(i, whole);
    }
    tp->all_reduce_sum(grads);
    for (const auto& [i, whole] : wholes) {
      at::Tensor& p = trainable[i];
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      p.mutable_grad().copy_(replicated_layouts.at(names[i]).slice(whole));
    }
  }

  // The same sums on FSDP's shards: the ranks of a tensor-parallel group hold the same data-parallel
  // slice of alike-shaped units, so a parameter's part of the slice is at the same place on each.
  // A replicated kv slice's part goes at its chunk's place in a buffer of every chunk's.
  void sum_tensor_parallel_shards() {
    if (partial_names.empty() && replicated_layouts.empty()) return;
    std::vector<at::Tensor> sums;
    std::vector<std::tuple<at::Tensor, at::Tensor, int64_t>> replicated;  // (slice part, buffer, offset)
    for (const auto& shard : fsdp->shards())
      for (size_t i = 0; i < shard->params().size(); ++i) {
        const auto o = shard->overlap(i);
        if (o.length == 0) continue;
        at::Tensor part = shard->grad.narrow(0, o.in_slice, o.length);
        const std::string& name = shard->names()[i];
        if (partial_names.count(name)) {
          sums.push_back(part);
        } else if (auto it = replicated_layouts.find(name); it != replicated_layouts.end()) {
          at::Tensor buffer = at::zeros({it->second.chunks * o.length}, part.options());
          buffer.narrow(0, it->second.chunk * o.length, o.length).copy_(part);
          sums.push_back(buffer);
          replicated.emplace_back(part, buffer, it->second.chunk * o.length);
        }
      }
    tp->all_reduce_sum(sums);
    for (auto& [part, buffer, offset] : replicated) part.copy_(buffer.narrow(0, offset, part.numel()));
  }

  double clip(double max_norm) override {
    if (sharded && expert_sharded) {
      const double norm = std::sqrt(sharded->gradient_square() + expert_sharded->gradient_square());
      sharded->clip_to(norm, max_norm);
      expert_sharded->clip_to(norm, max_norm);
      return norm;
    }
    if (sharded) return sharded->clip_gradients(max_norm);
    if (pipeline)
      return clip_grad_norm(trainable, split_share, counted, split.get(), *pipeline->comm(), max_norm);
    if (!expert_share.empty())
      return clip_grad_norm(trainable, split_share, *split, expert_share, *ep, max_norm);
    if (split_share.empty()) return clip_grad_norm(trainable, max_norm);
    return clip_grad_norm(trainable, split_share, *split, max_norm);
  }

  void gather_parameters() override {
    if (fsdp) fsdp->gather_all();
    if (pipeline) pipeline->gather();
    at::NoGradGuard no_grad;
    for (SplitExpert& e : experts) {
      e.local = e.param.data();
      e.param.set_data(e.layout.gather(e.local));
    }
  }
  void release_parameters() override {
    if (pipeline) pipeline->release();
    if (fsdp) fsdp->release_all();
    for (SplitExpert& e : experts) {
      e.param.set_data(e.local);
      e.local = at::Tensor();
    }
  }
  void reshard_from_parameters() override {
    if (fsdp) fsdp->reshard_from_parameters();
    if (pipeline) pipeline->release();
    at::NoGradGuard no_grad;
    for (SplitExpert& e : experts)
      if (e.local.defined()) e.local.copy_(e.layout.slice(e.param.data()));
  }

  std::vector<std::pair<std::string, at::Tensor>> whole_gradients() const override {
    std::vector<std::pair<std::string, at::Tensor>> grads;
    for (size_t i = 0; i < trainable.size(); ++i) {
      at::Tensor g = trainable[i].grad();
      if (!g.defined()) g = at::zeros_like(trainable[i]);
      auto it = layouts.find(names[i]);
      grads.emplace_back(names[i], it == layouts.end() ? g : it->second.gather(g));
    }
    return grads;
  }

  std::string summary(double waited_s, double step_s) const override {
    if (!reducers.empty()) {
      int64_t buckets = 0, started = 0;
      for (const auto& reducer : reducers) {
        buckets += reducer->bucket_count();
        started += reducer->started_in_backward();
      }
      return fmt::format(
          "gradient all-reduce: {:.3f} s waited after backward in {:.1f} s of steps ({} buckets of up to {} "
          "MiB{}, overlap {}; last step: {} started during backward)",
          waited_s, step_s, buckets, bucket_mb,
          reducers.size() > 1 ? ", the experts' over the expert-data group" : "", overlap ? "on" : "off",
          started);
    }
    if (sharded && !fsdp)
      return fmt::format("gradient reduce-scatter (ZeRO-1): {:.3f} s after backward in {:.1f} s of steps",
                         waited_s, step_s);
    if (fsdp)
      return fmt::format(
          "FSDP: {:.3f} s waited for gathers and reduce-scatters at the end of passes in {:.1f} s of steps; "
          "model state per rank {} bytes between steps, peak during passes {} bytes more (gathered "
          "parameters, unreduced gradients, reduce-scatter buffers)",
          waited_s, step_s, state_bytes_total, fsdp->peak_transient_bytes());
    return "";
  }

  int64_t state_bytes_total = 0;
};

}  // namespace

bool AppliedPlan::counts_samples(int64_t degree) const {
  const auto& cp = state->cp();
  return !cp || cp->rank() % (degree > 0 ? degree : cp->size()) == 0;
}

bool AppliedPlan::counts_step() const {
  const auto& pp = state->pp();
  return !pp || pp->rank() + 1 == pp->size();
}

std::vector<double> AppliedPlan::sum_over_ranks(std::vector<double> values) const {
  const auto& data = state->data();
  if (!data || values.empty()) return values;
  auto t = at::tensor(values, at::kDouble);
  data->all_reduce_sum({t});
  // The last pipeline stage counts what a step's micro-batches gave; the others add zeros.
  if (const auto& pp = state->pp()) pp->all_reduce_sum({t});
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

std::vector<std::string> AppliedPlan::summary(double receive_wait_s, double grad_sync_s,
                                              double step_s) const {
  std::vector<std::string> lines;
  if (pipeline.exchange)
    lines.push_back(fmt::format(
        "pipeline: {:.3f} s waited for the other stages in {:.1f} s of steps; {} header and gradient buffers "
        "reused",
        receive_wait_s, step_s, pipeline.exchange->buffers_reused()));
  if (std::string line = gradients->summary(grad_sync_s, step_s); !line.empty())
    lines.push_back(std::move(line));
  return lines;
}

AppliedPlan apply_parallelism(core::Model& model, const std::vector<NamedParam>& model_params,
                              const config::JobConfig& job,
                              std::shared_ptr<const dist::ParallelState> state) {
  const std::shared_ptr<dist::Comm>& data = state->data();
  const std::shared_ptr<dist::Comm>& tp = state->tp();
  const std::shared_ptr<dist::Comm>& pipeline = state->pp();
  const auto& p = job.parallel;
  const auto& t = job.training;
  const core::Layers layers = model.layers();
  core::RunnerChain runners;  // outermost first
  auto sync = std::make_unique<LayoutGradients>();
  // Under pipeline parallelism, this rank's stages' parameters: the rest is not held here.
  std::vector<NamedParam> params = model_params;
  if (pipeline) {
    if (job.tools.dump_gradients > 0)
      throw ConfigError(
          fmt::format("tools.dump_gradients: parallel.pp={} holds each stage's gradients on its own ranks; "
                      "dump them with pp 1",
                      p.pp));
    sync->pipeline = std::make_shared<PipelinePlacement>(model, job, pipeline);
    if (p.virtual_stages > 1) sync->interleave_group = p.pp;
    // Every rank refuses alike (the cut is the same everywhere), before any collective.
    if (job.features.recompute != "none" && job.features.recompute_layers > sync->pipeline->fewest_blocks())
      throw ConfigError(fmt::format(
          "features.recompute_layers: {} is more than the {} blocks of the smallest pipeline stage ({})",
          job.features.recompute_layers, sync->pipeline->fewest_blocks(), sync->pipeline->description()));
    params.clear();
    for (const auto& param : model_params)
      if (sync->pipeline->holds(param.name)) {
        params.push_back(param);
        sync->counted.push_back(sync->pipeline->counts(param.name));
      }
  }
  sync->data = data;
  sync->tp = tp;
  sync->bucket_mb = p.bucket_mb;
  sync->overlap = p.overlap_grad_reduce;
  sync->layouts = parallel::shard_layouts(model.module());
  for (const auto& param : params) {
    sync->trainable.push_back(param.param);
    sync->names.push_back(param.name);
  }
  const auto& layouts = sync->layouts;
  const int64_t tp_size = tp ? tp->size() : 1;
  // Expert parallelism: the experts' weights are slices over ep (whose norms sum over it), and
  // their gradients sum over the expert-data group rather than the data group.
  const std::shared_ptr<dist::Comm>& ep = state->ep();
  std::vector<NamedParam> data_params, expert_params;  // by gradient group
  for (const auto& param : params) {
    auto it = layouts.find(param.name);
    const bool expert = ep && it != layouts.end() && it->second.expert;
    (expert ? expert_params : data_params).push_back(param);
    if (ep) sync->split_share.push_back(expert ? 1.0 : 0.0);
  }
  const auto tensors_of = [](const std::vector<NamedParam>& group) {
    std::vector<at::Tensor> out;
    for (const auto& param : group) out.push_back(param.param);
    return out;
  };
  if (ep) {
    sync->split = ep;
    sync->ep = ep;
    sync->expert_parallel = ep->size();
    for (const auto& item : model.module().named_parameters(/*recurse=*/true))
      if (auto it = layouts.find(item.key()); it != layouts.end() && it->second.expert)
        sync->experts.push_back({item.value(), it->second, {}});
    int64_t expert_bytes = 0;
    for (const auto& param : expert_params) expert_bytes += static_cast<int64_t>(param.param.nbytes());
    spdlog::info(
        "expert parallelism (ep={}): this rank (expert rank {}) holds 1/{} of every MoE layer's experts, {} "
        "of their {} parameter bytes; their gradients are summed over {} expert-data-parallel rank(s), the "
        "other parameters' over the {} data-parallel ranks",
        ep->size(), ep->rank(), ep->size(), expert_bytes, expert_bytes * ep->size(),
        state->group({dist::Axis::edp})->size(), data ? data->size() : 1);
  }
  if (tp_size > 1) {
    // Beside expert parallelism the experts' slices are over ep, the others' over tp: two sums.
    if (ep) sync->expert_share = std::exchange(sync->split_share, {});
    sync->split = tp;
    for (const auto& param : params) {
      auto it = layouts.find(param.name);
      if (it != layouts.end() && it->second.expert) {  // whole on every tensor-parallel rank
        sync->split_share.push_back(0.0);
        if (it->second.partial_grad) sync->partial_names.insert(param.name);
        continue;
      }
      // A slice's squared norm counts once over the ranks holding it alike. (A layer built over no
      // group, such as the vision tower at vision_tp 1, is whole.)
      const bool cut =
          it != layouts.end() && it->second.dim >= 0 && it->second.comm && it->second.comm->size() > 1;
      sync->split_share.push_back(cut ? 1.0 / static_cast<double>(it->second.replicas()) : 0.0);
      if (cut && it->second.replicas() > 1) {
        if (it->second.parts != 1)
          throw ModelError(fmt::format("{}: a slice shared by several ranks must be one block", param.name));
        sync->replicated_layouts.emplace(param.name, it->second);
      }
      // Whole parameters run on one sequence chunk per rank (norms and row-parallel biases in
      // the blocks, under sequence parallelism) hold partial gradients.
      if (it != layouts.end() && it->second.partial_grad) sync->partial_names.insert(param.name);
    }
  }

  AppliedPlan plan;
  plan.state = state;
  ModelStateBytes& bytes = plan.bytes;
  const std::map<std::string, parallel::ShardLayout>* tp_layouts =
      tp_size > 1 || ep ? &sync->layouts : nullptr;
  AdamWOptions adamw{t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay};
  // Two memory features are CPU code today: an explicit refusal, not a silent no-op, on a GPU.
  if (t.device == "cuda" && job.features.reuse_fp32_param)
    throw ConfigError(
        "features.reuse_fp32_param: its split master is updated by a CPU kernel; training.device cuda keeps "
        "the fp32 master apart (remove it)");
  if (t.device == "cuda" && job.features.offload)
    throw ConfigError(
        "features.offload: spills CPU activations to a file; training.device cuda does not offload GPU "
        "activations yet (remove it; recompute alone works)");
  if (job.features.reuse_fp32_param) {
    if (t.precision != "bf16")
      throw ConfigError(fmt::format(
          "features.reuse_fp32_param: training.precision is {}; the fp32 weights are the parameters, with no "
          "separate master to reuse (it applies to bf16)",
          t.precision));
    if (data && p.zero == 3)
      throw ConfigError(
          "features.reuse_fp32_param: parallel.zero=3 (FSDP) holds each rank's slice of the fp32 master as "
          "the "
          "parameters themselves, with no bf16 copy to reuse (the bf16 weights are gathered from it for each "
          "use)");
    adamw.split_master = true;
  }
  std::string layout;
  if (data && p.zero == 3) {
    // FSDP: the units shard the parameters; the optimizer updates the units' slices.
    std::vector<std::pair<std::string, at::Tensor>> trainable;
    for (const auto& param : params) trainable.emplace_back(param.name, param.param);
    // Under pipeline parallelism, the layers of this rank's stages: the plan's layers among them.
    core::Layers held = layers;
    if (sync->pipeline) {
      held.clear();
      for (const core::Stage& chunk : sync->pipeline->chunks())
        held.insert(held.end(), chunk.layers.begin(), chunk.layers.end());
    }
    std::vector<std::string> units;
    const std::vector<bool> planned = parallel::fsdp_planned_layers(p.fsdp_plan, layers);
    for (size_t i = 0; i < layers.size(); ++i)
      if ((p.fsdp_plan.empty() ? layers[i]->block() : planned[i]) &&
          std::find(held.begin(), held.end(), layers[i]) != held.end())
        units.push_back(layers[i]->name());
    sync->fsdp = std::make_shared<parallel::FullyShardedModel>(data, trainable, held, units);
    runners.push_back(sync->fsdp);
    sync->sharded = std::make_shared<ShardedAdamW>(data, sync->fsdp->shards(), adamw);
    plan.optimizer = std::make_unique<ShardedOptimizer>(sync->sharded, tp_layouts);
    bytes.parameters = sync->fsdp->shard_parameter_bytes();  // the fp32 slices are the parameters
    bytes.gradients = sync->fsdp->shard_gradient_bytes();
    bytes.optimizer = sync->sharded->state_bytes() - bytes.parameters;
    const auto names = sync->fsdp->unit_names();
    layout = fmt::format(
        " (FSDP: 1/{} of every trainable parameter, gradient and moment, in the root unit and {} block "
        "units{})",
        data->size(), names.size() - 1,
        names.size() > 1 ? fmt::format(" {} to {}", names[1], names.back()) : std::string());
  } else {
    for (const auto& param : params) bytes.parameters += static_cast<int64_t>(param.param.nbytes());
    bytes.gradients = bytes.parameters;  // whole gradients, which ZeRO-1 reduce-scatters after backward
    if (data && p.zero == 1 && ep) {
      // ZeRO-1 over each gradient group: the experts' slices over the expert-data ranks (their norm
      // summed over ep), the other parameters' over the data ranks.
      std::map<std::string, double> expert_share;
      std::set<std::string> data_names, expert_names;
      for (const auto& param : data_params) data_names.insert(param.name);
      for (const auto& param : expert_params) {
        expert_names.insert(param.name);
        expert_share.emplace(param.name, 1.0);
      }
      sync->sharded = std::make_shared<ShardedAdamW>(data, data_params, adamw);
      sync->expert_sharded =
          std::make_shared<ShardedAdamW>(state->group({dist::Axis::edp}), expert_params, adamw);
      sync->expert_sharded->set_tensor_parallel(ep, std::move(expert_share));
      std::vector<GroupedOptimizer::Part> parts;
      parts.push_back({std::make_unique<ShardedOptimizer>(sync->sharded, nullptr), std::move(data_names)});
      parts.push_back(
          {std::make_unique<ShardedOptimizer>(sync->expert_sharded, tp_layouts), std::move(expert_names)});
      plan.optimizer = std::make_unique<GroupedOptimizer>(std::move(parts));
      bytes.optimizer = sync->sharded->state_bytes() + sync->expert_sharded->state_bytes();
      layout = fmt::format(
          " (ZeRO-1: 1/{} of the master weights{} and moments; the experts' over {} expert-data rank(s))",
          data->size(), adamw.split_master ? ", held as 16-bit residuals beside the bf16 parameters" : "",
          state->group({dist::Axis::edp})->size());
    } else if (data && p.zero == 1) {
      // ZeRO-1: the optimizer reduce-scatters the gradients itself.
      sync->sharded = std::make_shared<ShardedAdamW>(data, params, adamw);
      plan.optimizer = std::make_unique<ShardedOptimizer>(sync->sharded, tp_layouts);
      bytes.optimizer = sync->sharded->state_bytes();
      layout = fmt::format(" (ZeRO-1: 1/{} of the master weights{} and moments)", data->size(),
                           adamw.split_master ? ", held as 16-bit residuals beside the bf16 parameters" : "");
    } else {
      if (data)
        sync->reducers.push_back(std::make_unique<dist::GradReducer>(
            data, tensors_of(data_params), p.bucket_mb << 20, p.overlap_grad_reduce));
      const std::shared_ptr<dist::Comm> expert_data = ep ? state->group({dist::Axis::edp}) : nullptr;
      if (expert_data && expert_data->size() > 1)
        sync->reducers.push_back(std::make_unique<dist::GradReducer>(
            expert_data, tensors_of(expert_params), p.bucket_mb << 20, p.overlap_grad_reduce));
      auto whole = std::make_unique<WholeAdamW>(params, adamw, tp_layouts);
      bytes.optimizer = whole->state_bytes();
      if (adamw.split_master)
        layout = " (the fp32 master weights held as the bf16 parameters and 16-bit residuals)";
      plan.optimizer = std::move(whole);
    }
  }
  sync->state_bytes_total = bytes.total();
  if (sync->sharded && sync->pipeline) {
    // The norm sums over the pipeline's stages, each parameter counted by one of them.
    std::set<std::string> uncounted;
    for (size_t i = 0; i < params.size(); ++i)
      if (!sync->counted[i]) uncounted.insert(params[i].name);
    sync->sharded->set_pipeline(pipeline, std::move(uncounted));
  }
  if (sync->sharded && tp_size > 1) {
    // The norm over tensor-parallel slices counts each slice's share (whole parameters once).
    std::map<std::string, double> share;
    for (size_t i = 0; i < params.size(); ++i)
      if (sync->split_share[i] > 0) share.emplace(params[i].name, sync->split_share[i]);
    sync->sharded->set_tensor_parallel(tp, std::move(share));
  }

  if (tp_size > 1) {
    // What tensor parallelism saves: this rank's trainable parameter bytes against the whole model's.
    int64_t local = 0, whole = 0, split_local = 0, split_whole = 0;
    for (const auto& param : params) {
      auto it = layouts.find(param.name);
      const bool split = it != layouts.end() && it->second.split();
      const int64_t nbytes = static_cast<int64_t>(param.param.nbytes());
      const int64_t all = split ? nbytes * it->second.chunks : nbytes;
      local += nbytes;
      whole += all;
      if (split) split_local += nbytes, split_whole += all;
    }
    spdlog::info(
        "tensor parallelism (tp={}{}): this rank holds {} of the model's {} trainable parameter bytes "
        "({:.3f}x); "
        "the split layers {} of {} ({:.3f}x)",
        tp_size, p.sequence_parallel ? ", sequence parallel" : "", local, whole,
        static_cast<double>(local) / whole, split_local, split_whole,
        split_whole ? static_cast<double>(split_local) / split_whole : 0.0);
  }
  if (job.tools.dump_gradients > 0 && sync->sharded)
    throw ConfigError(
        fmt::format("tools.dump_gradients: parallel.zero={} shards the gradients over the ranks; "
                    "dump them with zero 0",
                    p.zero));
  spdlog::info(
      "memory on this rank: trainable parameters {:.1f} MiB, gradients {:.1f} MiB, optimizer state {:.1f} "
      "MiB{}; model state per rank: {} bytes",
      bytes.parameters / 1048576.0, bytes.gradients / 1048576.0, bytes.optimizer / 1048576.0, layout,
      bytes.total());
  if (p.zero == 3 && !data) parallel::fsdp_planned_layers(p.fsdp_plan, layers);  // a bad plan fails here too
  if (p.zero != 0 && !data)
    spdlog::info("parallel.zero={}: one process holds everything; there is nothing to shard", p.zero);
  const std::shared_ptr<PipelinePlacement> placement = sync->pipeline;
  plan.gradients = std::move(sync);
  if (placement) {
    std::set<std::string> trainable;
    for (const auto& param : model_params) trainable.insert(param.name);
    plan.optimizer = pipelined_optimizer(std::move(plan.optimizer), placement, std::move(trainable));
  }
  // One stage holding every layer, or this rank's chunks of a pipeline, each with a recompute runner
  // of its own (for its first recompute_layers blocks). Full recompute sits inside FSDP, which gathers
  // the layer again before its backward recomputes it; selective outside it, so that gather comes
  // before the refill of the norms' outputs.
  const std::vector<core::Stage> stages =
      placement ? placement->chunks() : std::vector<core::Stage>{core::Stage{layers, {}, true, true}};
  for (const core::Stage& bare : stages) {
    core::Stage stage = bare;
    stage.runners = runners;
    if (auto recompute = memory::recompute_runner(job.features, stage.layers)) {
      if (recompute->selective())
        stage.runners.insert(stage.runners.begin(), std::move(recompute));
      else
        stage.runners.push_back(std::move(recompute));
    }
    plan.stages.push_back(std::move(stage));
  }
  if (!placement) return plan;
  plan.pipeline = {std::make_shared<parallel::pipeline::CarryExchange>(pipeline, p.pp * p.virtual_stages,
                                                                       core::job_device(t)),
                   p.pipeline_schedule, job.features.recompute_in_bubbles};
  std::vector<std::string> held;
  for (const core::Stage& stage : plan.stages)
    held.push_back(fmt::format("{} to {}", stage.layers.front()->name(), stage.layers.back()->name()));
  spdlog::info("pipeline parallelism (pp={}, {}{}{}): {}; this rank (pipeline rank {}) runs {}",
               pipeline->size(), p.virtual_stages > 1 ? "interleaved 1f1b" : p.pipeline_schedule,
               p.virtual_stages > 1 ? fmt::format(", {} virtual stages", p.virtual_stages) : "",
               job.features.recompute_in_bubbles ? ", warm-up recomputed in the bubbles" : "",
               placement->description(), pipeline->rank(), fmt::join(held, ", "));
  return plan;
}

}  // namespace loom::train
