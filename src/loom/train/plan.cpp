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
#include "loom/train/gradient_syncs.h"
#include "loom/train/pipeline_placement.h"
#include "loom/train/schedule.h"
#include "loom/train/sharded_adamw.h"
#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::train {
namespace {

using Layouts = std::map<std::string, parallel::ShardLayout>;

// Optimizer state entries are "<kind>.<parameter name>" (and "step"): under tensor parallelism
// each is cut like its parameter. Whole entries from this rank's slices (a collective over the
// tensor-parallel group), or this rank's slices from whole entries.
std::vector<std::pair<std::string, at::Tensor>> tensor_parallel_state(
    const Layouts& layouts, std::vector<std::pair<std::string, at::Tensor>> state, bool gather) {
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
  WholeAdamW(std::vector<NamedParam> params, AdamWOptions options, std::shared_ptr<const Layouts> tp_layouts)
      : adamw_(std::move(params), options), tp_layouts_(std::move(tp_layouts)) {}
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
  std::shared_ptr<const Layouts> tp_layouts_;  // null: no parameter is split over ranks
};

// ZeRO-1 or FSDP: each rank updates its slices (of its tensor-parallel slices, under tensor
// parallelism).
class ShardedOptimizer : public Optimizer {
 public:
  ShardedOptimizer(std::shared_ptr<ShardedAdamW> sharded, std::shared_ptr<const Layouts> tp_layouts)
      : sharded_(std::move(sharded)), tp_layouts_(std::move(tp_layouts)) {}
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
  std::shared_ptr<const Layouts> tp_layouts_;  // null: no parameter is split over ranks
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
  // Under pipeline parallelism, this rank's stages' parameters: the rest is not held here.
  std::shared_ptr<PipelinePlacement> placement;
  std::vector<NamedParam> params = model_params;
  if (pipeline) {
    if (job.tools.dump_gradients > 0)
      throw ConfigError(
          fmt::format("tools.dump_gradients: parallel.pp={} holds each stage's gradients on its own ranks; "
                      "dump them with pp 1",
                      p.pp));
    placement = std::make_shared<PipelinePlacement>(model, job, pipeline);
    // Every rank refuses alike (the cut is the same everywhere), before any collective.
    if (job.features.recompute != "none" && job.features.recompute_layers > placement->fewest_blocks())
      throw ConfigError(fmt::format(
          "features.recompute_layers: {} is more than the {} blocks of the smallest pipeline stage ({})",
          job.features.recompute_layers, placement->fewest_blocks(), placement->description()));
    params.clear();
    for (const auto& param : model_params)
      if (placement->holds(param.name)) params.push_back(param);
  }
  const std::map<std::string, parallel::ShardLayout> layouts = parallel::shard_layouts(model.module());
  std::vector<at::Tensor> trainable;
  std::vector<std::string> names;
  for (const auto& param : params) {
    trainable.push_back(param.param);
    names.push_back(param.name);
  }
  const int64_t tp_size = tp ? tp->size() : 1;
  // Each parameter's place in the gradient norm: whole (counted once; under pp, by one stage), or a
  // slice whose squares sum over the group it is cut over.
  std::vector<NormShare> shares(params.size());
  if (placement)
    for (size_t i = 0; i < params.size(); ++i) shares[i].counted = placement->counts(params[i].name);
  // Expert parallelism: the experts' weights are slices over ep, and their gradients sum over the
  // expert-data group rather than the data group.
  const std::shared_ptr<dist::Comm>& ep = state->ep();
  std::vector<NamedParam> data_params, expert_params;  // by gradient group
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = layouts.find(params[i].name);
    const bool expert = ep && it != layouts.end() && it->second.expert;
    (expert ? expert_params : data_params).push_back(params[i]);
    if (expert) shares[i].group = ep;
  }
  const auto tensors_of = [](const std::vector<NamedParam>& group) {
    std::vector<at::Tensor> out;
    for (const auto& param : group) out.push_back(param.param);
    return out;
  };
  std::shared_ptr<ExpertSlices> expert_slices;
  if (ep) {
    std::vector<ExpertSlices::Expert> experts;  // every expert parameter, trainable or not
    for (const auto& item : model.module().named_parameters(/*recurse=*/true))
      if (auto it = layouts.find(item.key()); it != layouts.end() && it->second.expert)
        experts.push_back({item.value(), it->second, {}});
    expert_slices = std::make_shared<ExpertSlices>(ep->size(), std::move(experts));
    int64_t expert_bytes = 0;
    for (const auto& param : expert_params) expert_bytes += static_cast<int64_t>(param.param.nbytes());
    spdlog::info(
        "expert parallelism (ep={}): this rank (expert rank {}) holds 1/{} of every MoE layer's experts, {} "
        "of their {} parameter bytes; their gradients are summed over {} expert-data-parallel rank(s), the "
        "other parameters' over the {} data-parallel ranks",
        ep->size(), ep->rank(), ep->size(), expert_bytes, expert_bytes * ep->size(),
        state->group({dist::Axis::edp})->size(), data ? data->size() : 1);
  }
  // Tensor parallelism: the slices' squares sum over tp; under sequence parallelism some whole
  // parameters hold partial gradients, and kv slices several ranks hold alike have each its part.
  std::set<std::string> partial_names;
  std::map<std::string, parallel::ShardLayout> replicated_layouts;
  if (tp_size > 1) {
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].name;
      auto it = layouts.find(name);
      // Whole parameters run on one sequence chunk per rank (norms and row-parallel biases in the
      // blocks, and the experts beside tp, under sequence parallelism) hold partial gradients.
      if (it != layouts.end() && it->second.partial_grad) partial_names.insert(name);
      if (it != layouts.end() && it->second.expert) continue;  // whole on every tensor-parallel rank
      // A slice's squared norm counts once over the ranks holding it alike. (A layer built over no
      // group, such as the vision tower at vision_tp 1, is whole.)
      const bool cut =
          it != layouts.end() && it->second.dim >= 0 && it->second.comm && it->second.comm->size() > 1;
      if (!cut) continue;
      shares[i].group = tp;
      shares[i].weight = 1.0 / static_cast<double>(it->second.replicas());
      if (it->second.replicas() > 1) {
        if (it->second.parts != 1)
          throw ModelError(fmt::format("{}: a slice shared by several ranks must be one block", name));
        replicated_layouts.emplace(name, it->second);
      }
    }
  }

  AppliedPlan plan;
  plan.state = state;
  ModelStateBytes& bytes = plan.bytes;
  // The optimizers' state is saved whole: the slices' layouts, when any parameter is split.
  const auto tp_layouts = tp_size > 1 || ep ? std::make_shared<const Layouts>(layouts) : nullptr;
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
  std::shared_ptr<parallel::FullyShardedModel> fsdp, expert_fsdp;  // expert_fsdp: the experts' under ep
  std::vector<std::shared_ptr<ShardedAdamW>> sharded;  // ZeRO-1's, one per gradient group; or FSDP's
  std::shared_ptr<AllReduceGradients> all_reduce;
  if (data && p.zero == 3) {
    // FSDP: the units shard the parameters; the optimizer updates the units' slices.
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& param : params) named.emplace_back(param.name, param.param);
    // Under pipeline parallelism, the layers of this rank's stages: the plan's layers among them.
    core::Layers held = layers;
    if (placement) {
      held.clear();
      for (const core::Stage& chunk : placement->chunks())
        held.insert(held.end(), chunk.layers.begin(), chunk.layers.end());
    }
    std::vector<std::string> units;
    const std::vector<bool> planned = parallel::fsdp_planned_layers(p.fsdp_plan, layers);
    for (size_t i = 0; i < layers.size(); ++i)
      if ((p.fsdp_plan.empty() ? layers[i]->block() : planned[i]) &&
          std::find(held.begin(), held.end(), layers[i]) != held.end())
        units.push_back(layers[i]->name());
    // Under expert parallelism the experts' units are sharded over the expert-data group, the
    // others' over the data group: two FSDP engines, each a runner over the same layers.
    if (ep) {
      named.clear();
      for (const auto& param : data_params) named.emplace_back(param.name, param.param);
    }
    fsdp = std::make_shared<parallel::FullyShardedModel>(data, named, held, units);
    runners.push_back(fsdp);
    sharded.push_back(std::make_shared<ShardedAdamW>(data, fsdp->shards(), adamw));
    if (ep) {
      std::vector<std::pair<std::string, at::Tensor>> experts;
      std::map<std::string, double> expert_share;
      std::set<std::string> data_names, expert_names;
      for (const auto& param : data_params) data_names.insert(param.name);
      for (const auto& param : expert_params) {
        experts.emplace_back(param.name, param.param);
        expert_share.emplace(param.name, 1.0);
        expert_names.insert(param.name);
      }
      expert_fsdp = std::make_shared<parallel::FullyShardedModel>(state->group({dist::Axis::edp}), experts,
                                                                  held, units);
      runners.push_back(expert_fsdp);
      sharded.push_back(
          std::make_shared<ShardedAdamW>(state->group({dist::Axis::edp}), expert_fsdp->shards(), adamw));
      sharded.back()->set_tensor_parallel(ep, std::move(expert_share));
      std::vector<GroupedOptimizer::Part> parts;
      parts.push_back({std::make_unique<ShardedOptimizer>(sharded[0], tp_layouts), std::move(data_names)});
      parts.push_back({std::make_unique<ShardedOptimizer>(sharded[1], tp_layouts), std::move(expert_names)});
      plan.optimizer = std::make_unique<GroupedOptimizer>(std::move(parts));
    } else {
      plan.optimizer = std::make_unique<ShardedOptimizer>(sharded.front(), tp_layouts);
    }
    bytes.parameters =
        fsdp->shard_parameter_bytes() + (expert_fsdp ? expert_fsdp->shard_parameter_bytes() : 0);
    bytes.gradients = fsdp->shard_gradient_bytes() + (expert_fsdp ? expert_fsdp->shard_gradient_bytes() : 0);
    bytes.optimizer = -bytes.parameters;
    for (const auto& group : sharded) bytes.optimizer += group->state_bytes();
    const auto unit_names = fsdp->unit_names();
    layout = fmt::format(
        " (FSDP: 1/{} of every trainable parameter, gradient and moment, in the root unit and {} block "
        "units{})",
        data->size(), unit_names.size() - 1,
        unit_names.size() > 1 ? fmt::format(" {} to {}", unit_names[1], unit_names.back()) : std::string());
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
      sharded.push_back(std::make_shared<ShardedAdamW>(data, data_params, adamw));
      sharded.push_back(
          std::make_shared<ShardedAdamW>(state->group({dist::Axis::edp}), expert_params, adamw));
      sharded.back()->set_tensor_parallel(ep, std::move(expert_share));
      std::vector<GroupedOptimizer::Part> parts;
      parts.push_back({std::make_unique<ShardedOptimizer>(sharded[0], tp_layouts), std::move(data_names)});
      parts.push_back({std::make_unique<ShardedOptimizer>(sharded[1], tp_layouts), std::move(expert_names)});
      plan.optimizer = std::make_unique<GroupedOptimizer>(std::move(parts));
      bytes.optimizer = sharded[0]->state_bytes() + sharded[1]->state_bytes();
      layout = fmt::format(
          " (ZeRO-1: 1/{} of the master weights{} and moments; the experts' over {} expert-data rank(s))",
          data->size(), adamw.split_master ? ", held as 16-bit residuals beside the bf16 parameters" : "",
          state->group({dist::Axis::edp})->size());
    } else if (data && p.zero == 1) {
      // ZeRO-1: the optimizer reduce-scatters the gradients itself.
      sharded.push_back(std::make_shared<ShardedAdamW>(data, params, adamw));
      plan.optimizer = std::make_unique<ShardedOptimizer>(sharded.front(), tp_layouts);
      bytes.optimizer = sharded.front()->state_bytes();
      layout = fmt::format(" (ZeRO-1: 1/{} of the master weights{} and moments)", data->size(),
                           adamw.split_master ? ", held as 16-bit residuals beside the bf16 parameters" : "");
    } else {
      if (data) {
        all_reduce = std::make_shared<AllReduceGradients>(p.bucket_mb, p.overlap_grad_reduce);
        all_reduce->add_group(data, tensors_of(data_params), "");
        const std::shared_ptr<dist::Comm> expert_data = ep ? state->group({dist::Axis::edp}) : nullptr;
        if (expert_data && expert_data->size() > 1)
          all_reduce->add_group(expert_data, tensors_of(expert_params), "experts");
      }
      auto whole = std::make_unique<WholeAdamW>(params, adamw, tp_layouts);
      bytes.optimizer = whole->state_bytes();
      if (adamw.split_master)
        layout = " (the fp32 master weights held as the bf16 parameters and 16-bit residuals)";
      plan.optimizer = std::move(whole);
    }
  }
  if (!sharded.empty() && placement) {
    // The norm sums over the pipeline's stages, each parameter counted by one of them.
    std::set<std::string> uncounted;
    for (size_t i = 0; i < params.size(); ++i)
      if (!shares[i].counted) uncounted.insert(params[i].name);
    for (auto& group : sharded) group->set_pipeline(pipeline, uncounted);
  }
  if (!sharded.empty() && tp_size > 1) {
    // The norm over tensor-parallel slices counts each slice's share (whole parameters once).
    std::map<std::string, double> share;
    for (size_t i = 0; i < params.size(); ++i)
      if (shares[i].group == tp) share.emplace(params[i].name, shares[i].weight);
    sharded.front()->set_tensor_parallel(tp, std::move(share));
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
  if (job.tools.dump_gradients > 0 && !sharded.empty())
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

  // The layout's sync, one part per mode, in the order their work comes: the passes' all-reduce or
  // FSDP, tensor parallelism's sums, the pipeline's shared parameters, ZeRO-1's reduce-scatters; the
  // expert slices made whole after the pipeline's stages are; the norm over whole gradients when no
  // sharded optimizer holds them.
  auto sync = std::make_unique<ComposedSync>(data, layouts, trainable, names);
  if (all_reduce) sync->add(all_reduce);
  if (fsdp) sync->add(std::make_shared<FsdpGradients>(fsdp, sharded.front(), placement, bytes.total()));
  if (expert_fsdp)
    sync->add(std::make_shared<FsdpGradients>(expert_fsdp, sharded.back(), nullptr, bytes.total()));
  if (tp_size > 1 && (!partial_names.empty() || !replicated_layouts.empty()))
    sync->add(
        std::make_shared<TensorParallelSums>(tp, partial_names, replicated_layouts, trainable, names, fsdp));
  if (placement)
    sync->add(std::make_shared<PipelineGradients>(placement, /*sum_after_passes=*/!fsdp,
                                                  p.virtual_stages > 1 ? p.pp : 1));
  if (!sharded.empty() && !fsdp) sync->add(std::make_shared<Zero1Gradients>(sharded));
  if (expert_slices) sync->add(expert_slices);
  if (sharded.empty()) sync->add(std::make_shared<WholeGradientNorm>(trainable, shares, pipeline));
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
