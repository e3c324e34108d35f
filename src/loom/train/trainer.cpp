#include "loom/train/trainer.h"

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/data/batching.h"
#include "loom/data/loader.h"
#include "loom/kernels/cross_entropy.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/nn/attention.h"
#include "loom/parallel/cross_entropy.h"
#include "loom/train/flops.h"
#include "loom/train/metrics.h"
#include "loom/train/schedule.h"
#include "loom/util/errors.h"

namespace loom::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Checks that the ids the model was configured with are the tokenizer's.
void check_token_ids(const models::Qwen2VLConfig& model, const data::Tokenizer& tokenizer) {
  const std::pair<const char*, std::pair<int64_t, const char*>> ids[] = {
      {"image_token_id", {model.tokens.image, "<|image_pad|>"}},
      {"video_token_id", {model.tokens.video, "<|video_pad|>"}},
      {"vision_start_token_id", {model.tokens.vision_start, "<|vision_start|>"}},
      {"vision_end_token_id", {model.tokens.vision_end, "<|vision_end|>"}}};
  for (const auto& [key, id_token] : ids) {
    const int64_t expected = tokenizer.id(id_token.second);
    if (id_token.first != expected)
      throw ConfigError(fmt::format("model.hf_config.{}: {} is not the tokenizer's id of {} ({})", key,
                                    id_token.first, id_token.second, expected));
  }
  if (model.text.vocab_size < tokenizer.vocab_size())
    throw ConfigError(fmt::format("model.hf_config.vocab_size: {} is smaller than the tokenizer's {} tokens",
                                  model.text.vocab_size, tokenizer.vocab_size()));
}

// Sum of next-token cross-entropy over labelled positions (labels aligned with inputs), from the
// final hidden states. Under tensor parallelism the LM head gives this rank's slice of the
// vocabulary and the loss is computed on the slices; otherwise, with fused kernels, the head and
// the loss run chunk by chunk without the whole logits.
at::Tensor token_loss_sum(const models::Qwen2VLForConditionalGeneration& model, const at::Tensor& hidden,
                          const at::Tensor& labels) {
  const int64_t length = hidden.size(1);
  auto predicting = hidden.narrow(1, 0, length - 1);
  auto targets = labels.narrow(1, 1, length - 1).reshape({-1});
  const auto& tp = model.llm_tp();
  if (tp.size() == 1 && nn::fused_kernels())
    return kernels::linear_cross_entropy_sum(predicting.reshape({-1, hidden.size(2)}), model.lm_head_weight(),
                                             targets, data::kIgnoreIndex);
  auto logits = model.logits(predicting);
  auto predicted = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
  if (tp.size() > 1)
    return parallel::vocab_parallel_cross_entropy_sum(predicted, targets, tp.comm, model.vocab_start(),
                                                      data::kIgnoreIndex);
  return at::cross_entropy_loss(predicted, targets, {}, at::Reduction::Sum, data::kIgnoreIndex);
}

}  // namespace

models::VisionLanguageInputs model_inputs(const data::Batch& batch) {
  models::VisionLanguageInputs in;
  in.input_ids = batch.input_ids;
  in.attention_mask = batch.attention_mask;
  in.pixel_values = batch.pixel_values;
  in.image_grid_thw = batch.image_grid_thw;
  in.cu_seqlens = batch.cu_seqlens;
  return in;
}

models::Qwen2VLConfig job_model_config(const config::JobConfig& job) {
  if (!job.model.hf_config_path.empty()) {
    if (!fs::is_regular_file(job.model.hf_config_path))
      throw ConfigError(
          fmt::format("model.hf_config: '{}' is not a file (give a config.json path or inline fields)",
                      job.model.hf_config_path));
    return models::model_config_from_file(job.model.hf_config_path, job.model.family);
  }
  return models::model_config_from_json(job.model.family, job.model.hf_config,
                                        job.source + ": model.hf_config");
}

void validate_layout(const config::JobConfig& job, const int64_t world_size) {
  validate_layout(job, job_model_config(job), world_size);
}

void validate_layout(const config::JobConfig& job, const models::Qwen2VLConfig& model, int64_t world_size) {
  config::validate_parallel(job,
                            {model.text.num_heads, model.text.num_kv_heads, model.vision.num_heads,
                             model.text.vocab_size, model.text.num_layers},
                            world_size);
}

// One training step's data: its micro-batches and how many of its samples were over-long.
struct StepData {
  std::vector<data::Batch> micro_batches;
  int64_t truncated = 0, dropped = 0, skipped = 0;
};

struct Trainer::StepStats {
  double loss = 0, grad_norm = 0;
  int64_t tokens = 0, samples = 0;
  double flops = 0;
  double grad_sync_s = 0;  // gradient communication not hidden behind backward (all-reduce, ZeRO, FSDP)
  double forward_s = 0, backward_s = 0;
};

namespace {

// Builds step `step`'s micro-batches for this rank: every rank reads the step's samples and keeps
// its balanced share (balance_across_ranks).
std::function<StepData(int64_t)> step_maker(const JobData& data, const data::MicroBatching& batching,
                                            int64_t global, int64_t max_seq_len) {
  return [&data, batching, global, max_seq_len](int64_t step) {
    auto samples = data.train_examples(step * global, (step + 1) * global);
    if (samples.examples.empty())
      throw DataError(fmt::format(
          "step {}: none of its {} samples is usable ({} over data.max_seq_len {} dropped, {} skipped)",
          step + 1, global, samples.dropped, max_seq_len, samples.skipped));
    return StepData{data::rank_micro_batches(std::move(samples.examples), batching), samples.truncated,
                    samples.dropped, samples.skipped};
  };
}

}  // namespace

Trainer::Trainer(config::JobConfig job, std::shared_ptr<dist::Comm> comm)
    : job_(std::move(job)), comm_(std::move(comm)) {
  const auto& t = job_.training;
  model_config_ = job_model_config(job_);
  nn::set_fused_kernels(job_.features.fused_kernels);
  const int64_t world = comm_ ? comm_->size() : 1;
  validate_layout(job_, model_config_, world);
  // cp and pp are 1 (validate_parallel refuses the rest): the ranks are tp x dp.
  dp_ = config::data_parallel_size(job_.parallel, world);
  if (comm_) {
    const auto& p = job_.parallel;
    parallel_ = std::make_unique<dist::ParallelState>(comm_, dist::GridSizes{p.tp, p.cp, p.ep, dp_, p.pp});
    data_comm_ = parallel_->group({dist::Axis::dp, dist::Axis::cp});
    if (p.tp > 1) tp_ = {parallel_->group({dist::Axis::tp}), p.sequence_parallel};
  }
  accumulation_ = t.global_batch_size / (t.micro_batch_size * dp_);
  data::Qwen2VLImageOptions image;
  image.patch_size = model_config_.vision.patch_size;
  image.temporal_patch_size = model_config_.vision.temporal_patch_size;
  image.merge_size = model_config_.vision.spatial_merge_size;
  data_ = make_job_data(job_.data, models::derive_seed(static_cast<uint64_t>(t.seed), "data"), image);
  check_token_ids(model_config_, data_->tokenizer());

  parallel::ParamOptions options;
  options.dtype = t.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  options.tp = tp_;
  std::optional<parallel::TensorParallelGroup> vision_tp;
  if (job_.parallel.vision_tp == 1) vision_tp = parallel::TensorParallelGroup{};
  model_ = models::build_model(model_config_, options, vision_tp);
  layouts_ = parallel::shard_layouts(*model_);
  models::init_parameters(*model_, static_cast<uint64_t>(t.seed));
  if (!job_.model.init_from.empty()) load_weights(job_.model.init_from);

  // Freezing: every parameter under a listed module prefix stops training.
  const auto named = models::named_parameters(*model_);
  for (const auto& prefix : job_.model.freeze) {
    int64_t matched = 0;
    for (const auto& [name, param] : named)
      if (name == prefix || name.rfind(prefix + ".", 0) == 0) {
        param.set_requires_grad(false);
        ++matched;
      }
    if (matched == 0)
      throw ConfigError(
          fmt::format("model.freeze: '{}' matches no parameter (e.g. visual, visual.merger, model, "
                      "model.layers.0, lm_head)",
                      prefix));
  }
  std::vector<NamedParam> params;
  for (const auto& [name, param] : named)
    if (param.requires_grad()) {
      params.push_back({name, param});
      trainable_.push_back(param);
      trainable_names_.push_back(name);
    }
  if (params.empty()) throw ConfigError("model.freeze: every parameter is frozen; nothing would train");
  if (tp_.size() > 1) {
    for (const auto& p : params) {
      auto it = layouts_.find(p.name);
      // A slice's squared norm counts once over the ranks holding it alike. (A layer built over no
      // group, such as the vision tower at vision_tp 1, is whole.)
      const bool cut =
          it != layouts_.end() && it->second.dim >= 0 && it->second.comm && it->second.comm->size() > 1;
      tp_share_.push_back(cut ? 1.0 / static_cast<double>(it->second.replicas()) : 0.0);
      if (cut && it->second.replicas() > 1) {
        if (it->second.parts != 1)
          throw ModelError(fmt::format("{}: a slice shared by several ranks must be one block", p.name));
        tp_replicated_.emplace_back(p.param, it->second);
      }
      // Whole parameters run on one sequence chunk per rank (norms and row-parallel biases in
      // the blocks, under sequence parallelism) hold partial gradients.
      if (it != layouts_.end() && it->second.partial_grad) tp_partial_.push_back(p.param);
    }
  }
  const AdamWOptions adamw{t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay};
  if (data_comm_ && job_.parallel.zero == 3) {
    // FSDP: the units shard the parameters; the optimizer updates the units' slices.
    std::vector<std::pair<std::string, at::Tensor>> trainable;
    for (const auto& p : params) trainable.emplace_back(p.name, p.param);
    const auto blocks = model_->blocks();
    std::vector<std::string> plan = job_.parallel.fsdp_plan;
    if (plan.empty())
      for (const auto& block : blocks) plan.push_back(block.first);
    fsdp_ = std::make_shared<parallel::FullyShardedModel>(data_comm_, trainable, blocks, plan);
    model_->set_block_runner(fsdp_);
    sharded_ = std::make_unique<ShardedAdamW>(data_comm_, fsdp_->shards(), adamw);
  } else if (data_comm_ && job_.parallel.zero == 1) {
    // ZeRO-1: the optimizer reduce-scatters the gradients itself.
    sharded_ = std::make_unique<ShardedAdamW>(data_comm_, std::move(params), adamw);
  } else {
    if (data_comm_)
      reducer_ = std::make_unique<dist::GradReducer>(data_comm_, trainable_, job_.parallel.bucket_mb << 20,
                                                     job_.parallel.overlap_grad_reduce);
    optimizer_ = std::make_unique<AdamW>(std::move(params), adamw);
  }
  if (tp_.size() > 1) {
    // What tensor parallelism saves: this rank's trainable parameter bytes against the whole model's.
    int64_t local = 0, whole = 0, split_local = 0, split_whole = 0;
    for (size_t i = 0; i < trainable_.size(); ++i) {
      const at::Tensor& p = trainable_[i];
      auto it = layouts_.find(trainable_names_[i]);
      const bool split = it != layouts_.end() && it->second.split();
      const int64_t all = split ? p.nbytes() * it->second.chunks : p.nbytes();
      local += p.nbytes();
      whole += all;
      if (split) split_local += p.nbytes(), split_whole += all;
    }
    spdlog::info(
        "tensor parallelism (tp={}{}): this rank holds {} of the model's {} trainable parameter bytes "
        "({:.3f}x); "
        "the split layers {} of {} ({:.3f}x)",
        tp_.size(), job_.parallel.sequence_parallel ? ", sequence parallel" : "", local, whole,
        static_cast<double>(local) / whole, split_local, split_whole,
        split_whole ? static_cast<double>(split_local) / split_whole : 0.0);
  }
  if (job_.tools.dump_gradients > 0 && sharded_)
    throw ConfigError(
        fmt::format("tools.dump_gradients: parallel.zero={} shards the gradients over the ranks; "
                    "dump them with zero 0",
                    job_.parallel.zero));
  const ModelStateBytes bytes = model_state_bytes();
  std::string layout = "";
  if (fsdp_) {
    const auto units = fsdp_->unit_names();
    layout = fmt::format(
        " (FSDP: 1/{} of every trainable parameter, gradient and moment, in the root unit and {} block "
        "units{})",
        data_comm_->size(), units.size() - 1,
        units.size() > 1 ? fmt::format(" {} to {}", units[1], units.back()) : std::string());
  } else if (sharded_) {
    layout = fmt::format(" (ZeRO-1: 1/{} of the master weights and moments)", data_comm_->size());
  }
  spdlog::info(
      "memory on this rank: trainable parameters {:.1f} MiB, gradients {:.1f} MiB, optimizer state {:.1f} "
      "MiB{}; model state per rank: {} bytes",
      bytes.parameters / 1048576.0, bytes.gradients / 1048576.0, bytes.optimizer / 1048576.0, layout,
      bytes.total());
  if (job_.parallel.zero == 3 && !data_comm_)
    parallel::fsdp_planned_blocks(job_.parallel.fsdp_plan, model_->blocks());  // a bad plan fails here too
  if (job_.parallel.zero != 0 && !data_comm_)
    spdlog::info("parallel.zero={}: one process holds everything; there is nothing to shard",
                 job_.parallel.zero);
}

Trainer::ModelStateBytes Trainer::model_state_bytes() const {
  ModelStateBytes bytes;
  if (fsdp_) {
    bytes.parameters = fsdp_->shard_parameter_bytes();  // the fp32 slices are the parameters
    bytes.gradients = fsdp_->shard_gradient_bytes();
    bytes.optimizer = sharded_->state_bytes() - bytes.parameters;
    return bytes;
  }
  for (const auto& p : trainable_) bytes.parameters += static_cast<int64_t>(p.nbytes());
  bytes.gradients = bytes.parameters;  // whole gradients, which ZeRO-1 reduce-scatters after backward
  bytes.optimizer = sharded_ ? sharded_->state_bytes() : optimizer_->state_bytes();
  return bytes;
}

namespace {

// Every parameter whole for as long as it lives (FSDP), on every rank; nothing without FSDP.
class WholeParameters {
 public:
  explicit WholeParameters(parallel::FullyShardedModel* fsdp) : fsdp_(fsdp) {
    if (fsdp_) fsdp_->gather_all();
  }
  ~WholeParameters() {
    if (fsdp_) fsdp_->release_all();
  }
  WholeParameters(const WholeParameters&) = delete;
  WholeParameters& operator=(const WholeParameters&) = delete;

 private:
  parallel::FullyShardedModel* fsdp_;
};

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

}  // namespace

Trainer::~Trainer() = default;

void Trainer::load_weights(const std::string& dir) {
  WholeParameters whole(fsdp_.get());
  models::load_parameters(*model_, dir);
  if (fsdp_) fsdp_->reshard_from_parameters();
}

std::optional<std::string> Trainer::resume_directory() const {
  const auto& resume = job_.training.resume;
  if (resume == "none") return std::nullopt;
  if (resume == "auto") return checkpoint::latest_checkpoint(job_.training.output_dir);
  if (!fs::is_directory(resume))
    throw ConfigError(
        fmt::format("training.resume: '{}' is not a checkpoint directory (valid: auto, none, or a "
                    "directory)",
                    resume));
  return resume;
}

void Trainer::resume_from(const std::string& dir) {
  load_weights(dir);
  auto state = nlohmann::json::parse(checkpoint::read_text_file(dir + "/trainer_state.json"));
  checkpoint::SafetensorsReader reader(dir + "/optimizer.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& name : reader.names()) tensors.emplace_back(name, reader.load(name));
  try {
    if (sharded_) {
      sharded_->load_state_dict(tensors);
    } else {
      if (tp_.size() > 1) tensors = tensor_parallel_state(layouts_, std::move(tensors), /*gather=*/false);
      optimizer_->load_state_dict(tensors);
    }
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format("{}/optimizer.safetensors: {}", dir, e.what()));
  }
  step_ = state.at("step").get<int64_t>();
  if (state.at("global_batch_size").get<int64_t>() != job_.training.global_batch_size)
    throw CheckpointError(
        fmt::format("{}: saved with global_batch_size {}, the job asks for {}; the data position "
                    "would not line up",
                    dir, state.at("global_batch_size").get<int64_t>(), job_.training.global_batch_size));
  spdlog::info("resumed from {} at step {}", dir, step_);
}

void Trainer::save_checkpoint() {
  // Under ZeRO-1 every rank takes part in gathering the optimizer state, under tensor
  // parallelism in gathering the slices of it and of the weights.
  auto optimizer_state = sharded_ ? sharded_->state_dict() : optimizer_->state_dict();
  if (tp_.size() > 1)
    optimizer_state = tensor_parallel_state(layouts_, std::move(optimizer_state),
                                            /*gather=*/true);
  WholeParameters whole(fsdp_.get());  // every rank takes part in gathering the FSDP units
  const auto weights = models::whole_named_parameters(*model_);
  if (!is_main()) {  // rank 0 saves; the others wait so no rank runs ahead of a checkpoint
    comm_->barrier();
    return;
  }
  const auto& t = job_.training;
  checkpoint::StagedDirectory staged(t.output_dir, checkpoint::checkpoint_name(step_));
  const std::string dir = staged.path();
  checkpoint::save_safetensors(dir + "/model.safetensors", weights, {{"format", "pt"}});
  checkpoint::write_text_file_durable(dir + "/config.json",
                                      models::to_hf_config(model_config_).dump(2) + "\n");
  data_->save_tokenizer(dir);
  checkpoint::save_safetensors(dir + "/optimizer.safetensors", optimizer_state);
  nlohmann::json state = {{"step", step_},
                          {"global_batch_size", t.global_batch_size},
                          {"micro_batch_size", t.micro_batch_size},
                          {"data_position", step_ * t.global_batch_size},
                          {"seed", t.seed}};
  checkpoint::write_text_file_durable(dir + "/trainer_state.json", state.dump(2) + "\n");
  checkpoint::write_text_file_durable(dir + "/job.yaml", config::to_yaml(job_));
  staged.commit();
  checkpoint::prune_checkpoints(t.output_dir, static_cast<int>(t.keep_last));
  spdlog::info("saved checkpoint {}", staged.final_path());
  if (comm_) comm_->barrier();
}

std::vector<double> Trainer::sum_over_ranks(std::vector<double> values) const {
  if (!data_comm_ || values.empty()) return values;
  auto t = at::tensor(values, at::kDouble);
  data_comm_->all_reduce_sum({t});
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

Trainer::StepStats Trainer::train_step(const std::vector<data::Batch>& micro_batches) {
  StepStats stats;
  int64_t local_targets = 0;
  for (const auto& b : micro_batches) local_targets += b.num_target_tokens;
  // With FSDP every rank makes as many passes as the rank with the most micro-batches (its
  // collectives pair with theirs): the counts travel with the target count.
  std::vector<double> counts{static_cast<double>(local_targets)};
  if (fsdp_) {
    counts.resize(1 + static_cast<size_t>(data_comm_->size()), 0.0);
    counts[1 + static_cast<size_t>(data_comm_->rank())] = static_cast<double>(micro_batches.size());
  }
  counts = sum_over_ranks(counts);
  const auto targets = static_cast<int64_t>(counts[0]);
  if (targets == 0) throw DataError("a training step has no target tokens to learn from");
  size_t passes = micro_batches.size();
  for (size_t r = 1; r < counts.size(); ++r) passes = std::max(passes, static_cast<size_t>(counts[r]));
  // Loss is the mean over every target token of the global batch, so the gradient does not
  // depend on how the batch is split into micro-batches or over data-parallel ranks.
  const double scale = 1.0 / static_cast<double>(targets);
  double loss_sum = 0;
  for (size_t m = 0; m < passes; ++m) {
    if (fsdp_) fsdp_->begin_pass();
    if (m >= micro_batches.size()) {  // FSDP: this rank's share had fewer micro-batches
      stats.grad_sync_s += fsdp_->end_pass();
      continue;
    }
    const data::Batch& batch = micro_batches[m];
    const auto forward_begin = Clock::now();
    auto hidden = model_->hidden_states(model_inputs(batch));
    auto loss = token_loss_sum(*model_, hidden, batch.labels);
    stats.forward_s += seconds_since(forward_begin);
    // Only the last micro-batch's backward communicates: earlier ones only accumulate.
    if (reducer_ && m + 1 == micro_batches.size()) reducer_->arm();
    const auto backward_begin = Clock::now();
    (loss * scale).backward();
    stats.backward_s += seconds_since(backward_begin);
    loss_sum += loss.item<double>();
    stats.tokens += batch.attention_mask.sum().item<int64_t>();
    const std::vector<int64_t> lengths = batch.sequence_lengths();
    stats.samples += static_cast<int64_t>(lengths.size());
    stats.flops += model_->training_flops(lengths, batch.image_grid_thw);
    if (fsdp_) stats.grad_sync_s += fsdp_->end_pass();
  }
  if (comm_) {
    // Each rank holds its share's part of the global mean's gradient: their sum is the gradient.
    if (fsdp_) {
      const auto begin = Clock::now();
      stats.grad_norm = sharded_->clip_gradients(job_.training.clip_grad);
      stats.grad_sync_s += seconds_since(begin);
    } else if (sharded_) {
      const auto begin = Clock::now();
      stats.grad_norm = sharded_->reduce_gradients(job_.training.clip_grad);
      stats.grad_sync_s = seconds_since(begin);
    } else {
      stats.grad_sync_s = reducer_->finish();
    }
    if (!tp_partial_.empty() || !tp_replicated_.empty()) {
      // Sequence parallelism: each tensor-parallel rank holds part of these gradients. Replicated
      // kv slices: each rank holding one has its query heads' part; every rank adds its part at
      // its slice's place in a whole-size buffer, and the sum over the group holds every slice's.
      const auto begin = Clock::now();
      std::vector<at::Tensor> grads, wholes;
      for (const auto& p : tp_partial_)
        if (p.grad().defined()) grads.push_back(p.grad());
      for (const auto& [p, layout] : tp_replicated_) {
        at::Tensor whole = at::zeros(layout.whole_shape(p.sizes()), p.options());
        if (p.grad().defined())
          whole.narrow(layout.dim, layout.chunk * p.size(layout.dim), p.size(layout.dim)).copy_(p.grad());
        grads.push_back(whole);
        wholes.push_back(whole);
      }
      tp_.comm->all_reduce_sum(grads);
      for (size_t i = 0; i < tp_replicated_.size(); ++i) {
        at::Tensor& p = tp_replicated_[i].first;
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
        p.mutable_grad().copy_(tp_replicated_[i].second.slice(wholes[i]));
      }
      stats.grad_sync_s += seconds_since(begin);
    }
  }
  if (job_.tools.dump_gradients == step_ + 1) dump_gradients();
  if (comm_) {
    const auto totals = sum_over_ranks(
        {loss_sum, static_cast<double>(stats.tokens), static_cast<double>(stats.samples), stats.flops});
    loss_sum = totals[0];
    stats.tokens = static_cast<int64_t>(totals[1]);
    stats.samples = static_cast<int64_t>(totals[2]);
    stats.flops = totals[3];
  }
  stats.loss = loss_sum * scale;
  if (!sharded_)
    stats.grad_norm = tp_share_.empty()
                          ? clip_grad_norm(trainable_, job_.training.clip_grad)
                          : clip_grad_norm(trainable_, tp_share_, *tp_.comm, job_.training.clip_grad);
  return stats;
}

void Trainer::dump_gradients() const {
  std::vector<std::pair<std::string, at::Tensor>> grads;
  for (size_t i = 0; i < trainable_.size(); ++i) {
    at::Tensor g = trainable_[i].grad();
    if (!g.defined()) g = at::zeros_like(trainable_[i]);
    auto it = layouts_.find(trainable_names_[i]);
    grads.emplace_back(trainable_names_[i], it == layouts_.end() ? g : it->second.gather(g));
  }
  if (!is_main()) return;
  const std::string dir = job_.training.output_dir + "/gradients";
  fs::create_directories(dir);
  const std::string path = fmt::format("{}/step-{:08d}.safetensors", dir, step_ + 1);
  checkpoint::save_safetensors(path, grads);
  spdlog::info("wrote the gradients of step {} to {}", step_ + 1, path);
}

void Trainer::optimizer_step(double lr) {
  if (sharded_) {
    sharded_->step(lr);
    sharded_->zero_grad();
  } else {
    optimizer_->step(lr);
    optimizer_->zero_grad();
  }
}

void Trainer::export_steps(const std::string& dir, int64_t steps) {
  if (comm_) throw ConfigError("data export: runs in one process (it writes the whole global batch)");
  if (steps < 1) throw ConfigError(fmt::format("data export: needs --steps >= 1, got {}", steps));
  const auto& t = job_.training;
  fs::create_directories(dir + "/model");
  fs::create_directories(dir + "/steps");
  checkpoint::save_safetensors(dir + "/model/model.safetensors", models::named_parameters(*model_),
                               {{"format", "pt"}});
  checkpoint::write_text_file_durable(dir + "/model/config.json",
                                      models::to_hf_config(model_config_).dump(2) + "\n");
  const nlohmann::json settings = {{"steps", t.steps},
                                   {"exported_steps", steps},
                                   {"global_batch_size", t.global_batch_size},
                                   {"micro_batch_size", t.micro_batch_size},
                                   {"lr", t.lr},
                                   {"min_lr", t.min_lr},
                                   {"warmup_steps", t.warmup_steps},
                                   {"weight_decay", t.weight_decay},
                                   {"adam_beta1", t.adam_beta1},
                                   {"adam_beta2", t.adam_beta2},
                                   {"adam_eps", t.adam_eps},
                                   {"clip_grad", t.clip_grad},
                                   {"precision", t.precision},
                                   {"packing", job_.data.packing},
                                   {"threads", at::get_num_threads()}};
  checkpoint::write_text_file_durable(dir + "/job.json", settings.dump(2) + "\n");
  const data::MicroBatching batching{t.micro_batch_size, job_.data.packing, padding_id(data_->tokenizer()), 0,
                                     1};
  const auto make = step_maker(*data_, batching, t.global_batch_size, job_.data.max_seq_len);
  for (int64_t step = 0; step < steps; ++step) {
    const StepData data = make(step);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (size_t m = 0; m < data.micro_batches.size(); ++m) {
      const data::Batch& b = data.micro_batches[m];
      const std::string key = std::to_string(m) + ".";
      tensors.emplace_back(key + "input_ids", b.input_ids);
      tensors.emplace_back(key + "labels", b.labels);
      tensors.emplace_back(key + "attention_mask", b.attention_mask);
      tensors.emplace_back(
          key + "position_ids",
          models::rope_index(b.input_ids, b.image_grid_thw, b.attention_mask, model_config_, b.cu_seqlens)
              .position_ids);
      if (b.pixel_values.defined() && b.pixel_values.numel() > 0) {
        tensors.emplace_back(key + "pixel_values", b.pixel_values);
        tensors.emplace_back(key + "image_grid_thw", b.image_grid_thw);
      }
      if (b.packed()) tensors.emplace_back(key + "cu_seqlens", at::tensor(b.cu_seqlens, at::kLong));
    }
    checkpoint::save_safetensors(fmt::format("{}/steps/step-{:06d}.safetensors", dir, step + 1), tensors);
  }
  spdlog::info("exported the initial weights and {} steps of {} samples to {}", steps, t.global_batch_size,
               dir);
}

BenchResult Trainer::bench(int64_t warmup, int64_t steps) {
  if (warmup < 0 || steps < 1)
    throw ConfigError(fmt::format("bench: needs steps >= 1 and warmup >= 0, got {} and {}", steps, warmup));
  const auto& t = job_.training;
  if (t.threads > 0) at::set_num_threads(static_cast<int>(t.threads));
  peak_flops_ = t.peak_tflops > 0 ? t.peak_tflops * 1e12 : measure_sgemm_flops();
  const data::MicroBatching batching{t.micro_batch_size, job_.data.packing, padding_id(data_->tokenizer()),
                                     data_comm_ ? data_comm_->rank() : 0, dp_};
  data::PrefetchLoader<StepData> loader(
      step_maker(*data_, batching, t.global_batch_size, job_.data.max_seq_len), 0,
      static_cast<int>(job_.data.num_workers), static_cast<int>(job_.data.prefetch));
  BenchResult r;
  r.steps = steps;
  r.warmup = warmup;
  r.ranks = dp_;
  r.sgemm_gflops = peak_flops_ / 1e9;
  std::vector<double> step_times;
  double tokens = 0, samples = 0, flops = 0;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    const auto begin = Clock::now();
    const double wait_before = loader.wait_seconds();
    const StepData step = loader.next();
    const double data_wait = loader.wait_seconds() - wait_before;
    const StepStats stats = train_step(step.micro_batches);
    const auto optimizer_begin = Clock::now();
    optimizer_step(learning_rate(i, t.steps, t.warmup_steps, t.lr, t.min_lr));
    const double optimizer_s = seconds_since(optimizer_begin), seconds = seconds_since(begin);
    if (i < warmup) continue;
    step_times.push_back(seconds);
    r.total_s += seconds;
    r.data_s += data_wait;
    r.forward_s += stats.forward_s;
    r.backward_s += stats.backward_s;
    r.optimizer_s += optimizer_s;
    r.communication_s += stats.grad_sync_s;
    tokens += static_cast<double>(stats.tokens);
    samples += static_cast<double>(stats.samples);
    flops += stats.flops;
  }
  std::sort(step_times.begin(), step_times.end());
  r.step_time_median_s = step_times[step_times.size() / 2];
  r.tokens_per_s = tokens / r.total_s;
  r.samples_per_s = samples / r.total_s;
  r.mfu = flops / r.total_s / (peak_flops_ * static_cast<double>(dp_ * tp_.size()));
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  r.peak_rss_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
  return r;
}

std::optional<EvalResult> Trainer::train() {
  const auto& t = job_.training;
  if (t.threads > 0) at::set_num_threads(static_cast<int>(t.threads));
  peak_flops_ = t.peak_tflops > 0 ? t.peak_tflops * 1e12 : measure_sgemm_flops();
  fs::create_directories(t.output_dir);
  if (auto dir = resume_directory()) resume_from(*dir);
  // Rank 0 writes the run's files; every rank holds the same weights and optimizer state.
  std::optional<MetricsLog> metrics;
  if (is_main()) {
    checkpoint::write_text_file_durable(t.output_dir + "/job.yaml", config::to_yaml(job_));
    metrics.emplace(t.output_dir, step_);
  }
  spdlog::info(
      "training {} parameters ({} trainable) for {} steps, global batch {} = {} data-parallel ranks x {} "
      "x {} micro-batches",
      models::parameter_count(*model_),
      [&] {
        int64_t n = 0;
        for (const auto& p : trainable_) n += p.numel();
        return n;
      }(),
      t.steps, t.global_batch_size, dp_, accumulation_, t.micro_batch_size);

  // One loader item is one step's micro-batches on this rank, so the data position is the step.
  // Every rank reads the step's samples and keeps its balanced share (balance_across_ranks).
  const data::MicroBatching batching{t.micro_batch_size, job_.data.packing, padding_id(data_->tokenizer()),
                                     data_comm_ ? data_comm_->rank() : 0, dp_};
  data::PrefetchLoader<StepData> loader(
      step_maker(*data_, batching, t.global_batch_size, job_.data.max_seq_len), step_,
      static_cast<int>(job_.data.num_workers), static_cast<int>(job_.data.prefetch));
  ProgressBar progress(t.steps, job_.tools.log_every, step_, stderr,
                       !is_main()                ? ProgressBar::Mode::off
                       : job_.tools.progress_bar ? ProgressBar::Mode::automatic
                                                 : ProgressBar::Mode::lines);
  const auto start = Clock::now();
  // Time the steps spent waiting for the loader, over all their time (this run's steps).
  double total_data_wait = 0, total_step_time = 0;
  double total_grad_sync = 0;  // waiting for the gradient all-reduce after backward (data parallel)
  int64_t overlong_truncated = 0, overlong_dropped = 0;  // this run's over-long training samples
  int64_t skipped = 0;                                   // and its unusable ones
  auto log_loader_share = [&] {
    spdlog::info(
        "loader share of step time: {:.2f}% ({:.2f} s waiting for data in {:.1f} s of steps); "
        "over-long samples: {} truncated, {} dropped; unusable samples skipped: {}",
        100.0 * total_data_wait / std::max(total_step_time, 1e-9), total_data_wait, total_step_time,
        overlong_truncated, overlong_dropped, skipped);
    if (reducer_)
      spdlog::info(
          "gradient all-reduce: {:.3f} s waited after backward in {:.1f} s of steps ({} buckets of up to {} "
          "MiB, overlap {}; last step: {} started during backward)",
          total_grad_sync, total_step_time, reducer_->bucket_count(), job_.parallel.bucket_mb,
          job_.parallel.overlap_grad_reduce ? "on" : "off", reducer_->started_in_backward());
    if (sharded_ && !fsdp_)
      spdlog::info("gradient reduce-scatter (ZeRO-1): {:.3f} s after backward in {:.1f} s of steps",
                   total_grad_sync, total_step_time);
    if (fsdp_) {
      const ModelStateBytes bytes = model_state_bytes();
      spdlog::info(
          "FSDP: {:.3f} s waited for gathers and reduce-scatters at the end of passes in {:.1f} s of steps; "
          "model state per rank {} bytes between steps, peak during passes {} bytes more (gathered "
          "parameters, unreduced gradients, reduce-scatter buffers)",
          total_grad_sync, total_step_time, bytes.total(), fsdp_->peak_transient_bytes());
    }
  };
  while (step_ < t.steps) {
    const auto step_start = Clock::now();
    const double wait_before = loader.wait_seconds();
    const StepData step_data = loader.next();
    const std::vector<data::Batch>& micro_batches = step_data.micro_batches;
    const double data_wait = loader.wait_seconds() - wait_before;
    skipped += step_data.skipped;
    if (step_data.truncated + step_data.dropped > 0) {
      overlong_truncated += step_data.truncated;
      overlong_dropped += step_data.dropped;
      spdlog::warn(
          "step {}: {} samples over data.max_seq_len {} were {} (this run so far: {} truncated, {} "
          "dropped)",
          step_ + 1, step_data.truncated + step_data.dropped, job_.data.max_seq_len,
          job_.data.overlong == "drop" ? "dropped" : "truncated", overlong_truncated, overlong_dropped);
    }

    const double lr = learning_rate(step_, t.steps, t.warmup_steps, t.lr, t.min_lr);
    auto stats = train_step(micro_batches);
    optimizer_step(lr);
    ++step_;

    const double seconds = seconds_since(step_start);
    total_data_wait += data_wait;
    total_step_time += seconds;
    total_grad_sync += stats.grad_sync_s;
    const double tokens_per_s = stats.tokens / seconds, samples_per_s = stats.samples / seconds;
    const double mfu = stats.flops / seconds / (peak_flops_ * static_cast<double>(dp_ * tp_.size()));
    if (metrics)
      metrics->write({{"step", step_},
                      {"loss", stats.loss},
                      {"lr", lr},
                      {"grad_norm", stats.grad_norm},
                      {"tokens_per_s", tokens_per_s},
                      {"samples_per_s", samples_per_s},
                      {"mfu", mfu},
                      {"step_time_s", seconds},
                      {"data_wait_s", data_wait},
                      {"grad_sync_s", stats.grad_sync_s}});
    progress.update(step_, stats.loss, lr, tokens_per_s, samples_per_s, mfu, seconds_since(start));
    const bool last = step_ == t.steps;
    if (t.eval_every > 0 && step_ % t.eval_every == 0 && !last) {
      progress.finish();
      log_loader_share();
      log_eval(evaluate(), metrics ? &*metrics : nullptr);
    }
    const bool exiting = !last && t.exit_interval > 0 && step_ % t.exit_interval == 0;
    if ((t.save_every > 0 && step_ % t.save_every == 0) || last || exiting) {
      progress.finish();
      save_checkpoint();
    }
    if (exiting) {
      spdlog::info("step {}: exit_interval {} reached; resume with the same command", step_, t.exit_interval);
      return std::nullopt;
    }
  }
  progress.finish();
  log_loader_share();
  auto result = evaluate();
  log_eval(result, metrics ? &*metrics : nullptr);
  return result;
}

void Trainer::log_eval(const EvalResult& result, MetricsLog* metrics) {
  if (result.samples == 0) {
    spdlog::info("step {}: no held-out samples (data.eval_datasets is empty): nothing to evaluate", step_);
    return;
  }
  nlohmann::json line = {{"step", step_}, {"eval_accuracy", result.accuracy}};
  std::string by_type;
  for (const auto& [type, acc] : result.per_type) {
    line["eval_accuracy_" + type] = acc;
    by_type += fmt::format("{}{} {:.1f}%", by_type.empty() ? "" : ", ", type, 100 * acc);
  }
  if (metrics) metrics->write(line);
  spdlog::info("step {}: eval accuracy {:.2f}% on {} held-out questions ({})", step_, 100 * result.accuracy,
               result.samples, by_type);
}

EvalResult Trainer::evaluate() {
  at::NoGradGuard no_grad;
  // FSDP: ranks decode different batches for different numbers of steps, so the weights are made
  // whole once rather than gathered per block (inference holds no gradients or optimizer state).
  WholeParameters whole(fsdp_.get());
  constexpr int64_t kBatch = 100;
  const auto& tokenizer = data_->tokenizer();
  const int64_t im_end = tokenizer.id("<|im_end|>");
  const int64_t pad = padding_id(tokenizer);
  // Batches are dealt round-robin to the data-parallel ranks (the ranks of a tensor-parallel
  // group decode the same batch together); each scored answer keeps its position in the held-out
  // set so the gathered result is in eval order on every rank.
  struct Scored {
    int64_t position;
    EvalPrediction prediction;
    bool correct;
  };
  std::vector<Scored> scored;
  const int64_t ranks = data_comm_ ? data_comm_->size() : 1, rank = data_comm_ ? data_comm_->rank() : 0;
  for (int64_t begin = 0, index = 0; begin < data_->eval_samples(); begin += kBatch, ++index) {
    if (index % ranks != rank) continue;
    const int64_t end = std::min(begin + kBatch, data_->eval_samples());
    auto batch = data_->eval_prompts(begin, end);
    const int64_t rows = batch.input_ids.size(0);
    auto lengths = batch.sequence_lengths();
    // Exact match: a prediction longer than the longest reference answer of the batch is wrong
    // whatever follows, so decoding stops there (one more step for <|im_end|>).
    int64_t max_new_tokens = 1;
    for (const auto& answer : batch.answers)
      max_new_tokens = std::max<int64_t>(max_new_tokens, tokenizer.encode(answer).size() + 1);
    // Room for the answer: right padding, so each row's new token goes at its own length.
    auto ids = at::cat({batch.input_ids, at::full({rows, max_new_tokens}, pad, at::kLong)}, 1);
    auto mask = at::cat({batch.attention_mask, at::zeros({rows, max_new_tokens}, at::kLong)}, 1);
    std::vector<std::vector<int64_t>> answers(rows);
    std::vector<bool> finished(rows, false);
    // Image embeddings do not change while decoding: compute them once.
    auto image_embeds = model_->image_embeddings(batch.pixel_values, batch.image_grid_thw);
    for (int64_t t = 0; t < max_new_tokens; ++t) {
      auto embeds = model_->model->embed_tokens->forward(ids);
      embeds = embeds.masked_scatter((ids == model_config_.tokens.image).unsqueeze(-1),
                                     image_embeds.to(embeds.scalar_type()));
      auto positions = models::rope_index(ids, batch.image_grid_thw, mask, model_config_).position_ids;
      auto hidden = model_->model->forward(embeds, positions);
      auto last = at::empty({rows}, at::kLong);
      for (int64_t r = 0; r < rows; ++r) last[r] = lengths[r] - 1;
      auto next = model_->whole_logits(hidden.index({at::arange(rows, at::kLong), last})).argmax(-1);
      bool all_done = true;
      for (int64_t r = 0; r < rows; ++r) {
        if (finished[r]) continue;
        const int64_t token = next[r].item<int64_t>();
        if (token == im_end) {
          finished[r] = true;
          continue;
        }
        answers[r].push_back(token);
        ids[r][lengths[r]] = token;
        mask[r][lengths[r]] = 1;
        ++lengths[r];
        all_done = false;
      }
      if (all_done) break;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const std::string predicted = tokenizer.decode(answers[r]);
      scored.push_back({begin + r,
                        {batch.questions[r], batch.answers[r], finished[r] ? predicted : predicted + " ...",
                         batch.question_types[r]},
                        finished[r] && predicted == batch.answers[r]});
    }
  }
  if (data_comm_) {
    nlohmann::json mine = nlohmann::json::array();
    for (const Scored& s : scored)
      mine.push_back({s.position, s.prediction.question, s.prediction.answer, s.prediction.predicted,
                      s.prediction.question_type, s.correct});
    scored.clear();
    for (const std::string& text : data_comm_->all_gather(mine.dump()))
      for (const auto& row : nlohmann::json::parse(text))
        scored.push_back({row[0].get<int64_t>(),
                          {row[1].get<std::string>(), row[2].get<std::string>(), row[3].get<std::string>(),
                           row[4].get<std::string>()},
                          row[5].get<bool>()});
    std::sort(scored.begin(), scored.end(),
              [](const Scored& a, const Scored& b) { return a.position < b.position; });
  }
  EvalResult result;
  std::map<std::string, int64_t> correct_by_type;
  int64_t correct = 0;
  for (Scored& s : scored) {
    correct += s.correct;
    correct_by_type[s.prediction.question_type] += s.correct;
    result.per_type_samples[s.prediction.question_type] += 1;
    result.predictions.push_back(std::move(s.prediction));
  }
  result.samples = static_cast<int64_t>(scored.size());
  result.accuracy = result.samples ? static_cast<double>(correct) / result.samples : 0.0;
  for (const auto& [type, n] : result.per_type_samples)
    result.per_type[type] = static_cast<double>(correct_by_type[type]) / n;
  return result;
}

void write_predictions(const EvalResult& result, const std::string& path) {
  std::string text;
  for (const EvalPrediction& p : result.predictions) {
    text += nlohmann::json{{"question", p.question},
                           {"answer", p.answer},
                           {"predicted", p.predicted},
                           {"question_type", p.question_type}}
                .dump() +
            "\n";
  }
  checkpoint::write_text_file_durable(path, text);
}

void print_eval(const EvalResult& result) {
  if (result.samples == 0) {
    fmt::print("eval: no held-out samples, nothing evaluated\n");
    return;
  }
  fmt::print("eval: exact-match accuracy {:.2f}% on {} held-out questions\n", 100 * result.accuracy,
             result.samples);
  for (const auto& [type, acc] : result.per_type)
    fmt::print("  {:<10} {:6.2f}%  ({} questions)\n", type, 100 * acc, result.per_type_samples.at(type));
}

}  // namespace loom::train
