#include "loom/train/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/run_lock.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/checkpoint/trainer_state.h"
#include "loom/models/weights.h"
#include "loom/tasks/registry.h"
#include "loom/train/flops.h"
#include "loom/train/forward_backward.h"
#include "loom/train/loss_plot.h"
#include "loom/train/metrics.h"
#include "loom/train/schedule.h"
#include "loom/train/step_feed.h"
#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

JobParts built_parts(const config::JobConfig& job, std::shared_ptr<dist::Comm> comm) {
  auto built = tasks::build_job(job, std::move(comm));
  return {std::move(built.layout), std::move(built.model), std::move(built.task)};
}

}  // namespace

Trainer::Trainer(config::JobConfig job, std::shared_ptr<dist::Comm> comm)
    : Trainer(job, built_parts(job, std::move(comm))) {}

Trainer::Trainer(config::JobConfig job, JobParts parts) : job_(std::move(job)), parts_(std::move(parts)) {
  tasks::resolve_steps(job_, *parts_.task);
  const auto& t = job_.training;
  accumulation_ = t.global_batch_size / (t.micro_batch_size * parts_.layout.data_parallel());
  // The model comes converted (models/converters.h): what still requires a gradient trains.
  core::Model& model = *parts_.model;
  std::vector<NamedParam> params;
  for (const auto& [name, param] : models::named_parameters(model.module()))
    if (param.requires_grad()) {
      params.push_back({name, param});
      trainable_.push_back(param);
    }
  if (params.empty()) throw ConfigError("model.freeze: every parameter is frozen; nothing would train");
  plan_ = apply_parallelism(model, params, job_, parts_.layout.parallel);
}

Trainer::~Trainer() = default;

void Trainer::load_weights(const std::string& dir) {
  WholeParameters whole(*plan_.gradients);
  models::load_parameters(parts_.model->module(), dir);
  plan_.gradients->reshard_from_parameters();
}

std::optional<std::string> Trainer::check() {
  auto dir = resume_directory();
  if (dir) resume_from(*dir);
  return dir;
}

std::optional<std::string> Trainer::resume_directory() const {
  const auto& resume = job_.training.resume;
  if (resume == "none") return std::nullopt;
  if (resume == "auto") {
    auto newest = checkpoint::latest_complete_checkpoint(job_.training.output_dir);
    if (!newest && !checkpoint::list_checkpoints(job_.training.output_dir).empty())
      spdlog::warn("{} holds no complete checkpoint: training starts from the initial weights",
                   job_.training.output_dir);
    return newest;
  }
  if (!fs::is_directory(resume))
    throw ConfigError(
        fmt::format("training.resume: '{}' is not a checkpoint directory (valid: auto, none, or a "
                    "directory)",
                    resume));
  if (const auto reason = checkpoint::incomplete_checkpoint(resume))
    throw CheckpointError(fmt::format("training.resume: {} cannot be resumed from: {}", resume, *reason));
  return resume;
}

void Trainer::resume_from(const std::string& dir) {
  const checkpoint::TrainerState state = checkpoint::read_trainer_state(dir);
  if (state.global_batch_size != job_.training.global_batch_size)
    throw CheckpointError(
        fmt::format("{}: saved with global_batch_size {}, the job asks for {}; the data position "
                    "would not line up",
                    dir, state.global_batch_size, job_.training.global_batch_size));
  load_weights(dir);
  checkpoint::SafetensorsReader reader(dir + "/optimizer.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& name : reader.names()) tensors.emplace_back(name, reader.load(name));
  try {
    plan_.optimizer->load_state_dict(tensors);
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format("{}/optimizer.safetensors: {}", dir, e.what()));
  }
  step_ = state.step;
  skipped_nonfinite_ = state.skipped_nonfinite_steps;
  spdlog::info("resumed from {} at step {}", dir, step_);
}

void Trainer::save_checkpoint() {
  // Every rank takes part in gathering the optimizer state and the weights of every layout.
  const auto optimizer_state = plan_.optimizer->state_dict();
  WholeParameters whole(*plan_.gradients);
  const auto weights = models::whole_named_parameters(parts_.model->module());
  // Every rank holds the whole weights here, so every rank refuses alike.
  for (const auto* tensors : {&weights, &optimizer_state})
    for (const auto& [name, tensor] : *tensors)
      if (tensor.is_floating_point() && !at::isfinite(tensor).all().item<bool>())
        throw TrainingError(fmt::format(
            "step {}: {} '{}' holds NaN or infinite values; the checkpoint is not saved (the last one "
            "stays the last good state)",
            step_, tensors == &weights ? "parameter" : "optimizer state", name));
  if (!parts_.layout.is_main()) {  // rank 0 saves; the others wait so no rank runs ahead of a checkpoint
    parts_.layout.world()->barrier();
    return;
  }
  const auto& t = job_.training;
  checkpoint::StagedDirectory staged(t.output_dir, checkpoint::checkpoint_name(step_));
  const std::string dir = staged.path();
  checkpoint::save_safetensors(dir + "/model.safetensors", weights, {{"format", "pt"}});
  checkpoint::write_text_file_durable(dir + "/config.json", parts_.model->hf_config().dump(2) + "\n");
  parts_.task->save_artifacts(dir);
  checkpoint::save_safetensors(dir + "/optimizer.safetensors", optimizer_state);
  checkpoint::TrainerState state;
  state.step = step_;
  state.global_batch_size = t.global_batch_size;
  state.micro_batch_size = t.micro_batch_size;
  state.seed = t.seed;
  state.skipped_nonfinite_steps = skipped_nonfinite_;
  checkpoint::write_text_file_durable(dir + "/" + checkpoint::kTrainerStateFile,
                                      checkpoint::trainer_state_json(state));
  checkpoint::write_text_file_durable(dir + "/job.yaml", config::to_yaml(job_));
  staged.commit();
  last_saved_ = staged.final_path();
  checkpoint::prune_checkpoints(t.output_dir, t.keep_last);
  spdlog::info("saved checkpoint {}", staged.final_path());
  if (parts_.layout.world()) parts_.layout.world()->barrier();
}

double Trainer::mfu(double flops, double seconds) const {
  return flops / seconds / (peak_flops_ * static_cast<double>(plan_.state->world_size()));
}

Trainer::StepStats Trainer::train_step(const core::StepData& step) {
  GradientSync& sync = *plan_.gradients;
  // The loss is the task's sum over the whole global batch divided by its count (target tokens),
  // known before the first backward, so the gradient does not depend on how the batch is split
  // into micro-batches or over data-parallel ranks.
  // The ranks of a cp group hold parts of the same samples: one of them counts them.
  const double samples_counted = plan_.counts_samples(step.context_parallel) ? 1.0 : 0.0;
  const auto [passes, count] =
      sync.passes_and_total(step.micro_batches.size(), samples_counted * step.loss_count);
  if (count == 0)
    throw DataError(fmt::format("a training step has no {} to learn from", parts_.task->loss_count_name()));
  const double scale = 1.0 / count;
  core::Task& task = *parts_.task;
  const ForwardStep forward_step = [&task](const core::MicroBatch& batch, const core::Stage& stage,
                                           core::Carry input) {
    return task.forward(batch, stage, std::move(input));
  };
  const ScheduleResult r = forward_backward(forward_step, plan_, step.micro_batches, passes, scale);
  StepStats stats;
  stats.forward_s = r.forward_s;
  stats.backward_s = r.backward_s;
  stats.activation_bytes = r.activation_bytes;
  stats.receive_wait_s = r.receive_wait_s;
  stats.grad_sync_s = r.sync_s + sync.reduce();
  if (job_.tools.dump_gradients == step_ + 1) dump_gradients();
  const double counted = plan_.counts_step() ? 1.0 : 0.0;
  std::vector<double> values{r.loss_sum,
                             samples_counted * static_cast<double>(r.tokens),
                             samples_counted * static_cast<double>(r.samples),
                             samples_counted * r.flops,
                             counted * static_cast<double>(step.truncated),
                             counted * static_cast<double>(step.dropped),
                             counted * static_cast<double>(step.skipped)};
  // A mixture of experts: per layer, the picks each expert got and those dropped (every rank adds as
  // many entries; the stages without the loss add zeros).
  const int64_t experts = parts_.model->experts();
  const int64_t routed = experts > 0 ? parts_.model->routed_layers() * (experts + 4) : 0;
  const size_t routed_at = values.size();
  if (routed > 0) {
    if (!r.expert_tokens.empty() && static_cast<int64_t>(r.expert_tokens.size()) != routed)
      throw ModelError(fmt::format("the model routes {} layers to {} experts but reports {} counts",
                                   parts_.model->routed_layers(), experts, r.expert_tokens.size()));
    std::vector<double> report = r.expert_tokens;
    report.resize(static_cast<size_t>(routed), 0.0);
    values.insert(values.end(), report.begin(), report.end());
  }
  const auto totals = plan_.sum_over_ranks(values);
  if (routed > 0) {
    const at::Tensor report =
        at::tensor(std::vector<double>(totals.begin() + static_cast<std::ptrdiff_t>(routed_at),
                                       totals.begin() + static_cast<std::ptrdiff_t>(routed_at + routed)),
                   at::kDouble)
            .view({parts_.model->routed_layers(), experts + 4});
    stats.layer_picks = report.narrow(1, 0, experts);
    const at::Tensor per_expert = stats.layer_picks.sum(0);
    const double sum = per_expert.sum().item<double>();
    if (sum > 0) stats.expert_load = per_expert.max().item<double>() / (sum / static_cast<double>(experts));
    stats.expert_tokens.assign(per_expert.data_ptr<double>(), per_expert.data_ptr<double>() + experts);
    stats.expert_dropped = report.select(1, experts).sum().item<double>();
    // Expert parallelism: the most loaded ep rank's rows over the mean, over every layer and pass.
    const double mean = report.select(1, experts + 3).sum().item<double>();
    if (mean > 0) {
      stats.ep_rank_load = report.select(1, experts + 2).sum().item<double>() / mean;
      stats.ep_rank_load_unreplicated = report.select(1, experts + 1).sum().item<double>() / mean;
    }
  }
  stats.loss = totals[0] * scale;
  stats.tokens = static_cast<int64_t>(totals[1]);
  stats.samples = static_cast<int64_t>(totals[2]);
  stats.flops = totals[3];
  stats.truncated = static_cast<int64_t>(totals[4]);
  stats.dropped = static_cast<int64_t>(totals[5]);
  stats.skipped = static_cast<int64_t>(totals[6]);
  stats.grad_norm = sync.clip(job_.training.clip_grad);
  return stats;
}

void Trainer::skip_nonfinite_step(double loss, double grad_norm) {
  const int64_t allowed = job_.training.skip_nonfinite_steps;
  const std::string what =
      fmt::format("step {}: the loss is {} and the gradient norm {}", step_ + 1, loss, grad_norm);
  if (skipped_nonfinite_ >= allowed)
    throw TrainingError(fmt::format(
        "{}; training stops{} (training.skip_nonfinite_steps {} allows {} such steps to be skipped{})", what,
        last_saved_.empty() ? "" : fmt::format(" and {} stays the last good checkpoint", last_saved_),
        allowed, allowed, skipped_nonfinite_ > 0 ? fmt::format(", and {} were", skipped_nonfinite_) : ""));
  plan_.optimizer->skip_step();
  ++skipped_nonfinite_;
  spdlog::warn("{}; skipped without an update ({} of the {} training.skip_nonfinite_steps allows)", what,
               skipped_nonfinite_, allowed);
}

void Trainer::dump_gradients() const {
  const auto grads = plan_.gradients->whole_gradients();
  if (!parts_.layout.is_main()) return;
  const std::string dir = job_.training.output_dir + "/gradients";
  fs::create_directories(dir);
  const std::string path = fmt::format("{}/step-{:08d}.safetensors", dir, step_ + 1);
  checkpoint::save_safetensors(path, grads);
  spdlog::info("wrote the gradients of step {} to {}", step_ + 1, path);
}

std::optional<checkpoint::RunDirectoryLock> Trainer::lock_output_dir() const {
  std::optional<checkpoint::RunDirectoryLock> lock;
  std::string refusal;
  if (parts_.layout.is_main()) {
    try {
      lock.emplace(job_.training.output_dir);
    } catch (const CheckpointError& e) {
      refusal = fmt::format("training.output_dir: {}", e.what());
    }
  }
  // Every rank learns rank 0's outcome, so a refused run ends on every rank with the same line.
  if (parts_.layout.world()) refusal = parts_.layout.world()->all_gather(refusal).front();
  if (!refusal.empty()) throw ConfigError(refusal);
  return lock;
}

std::optional<core::Evaluation> Trainer::train() {
  const auto& t = job_.training;
  in_training_ = true;
  // Before choosing the checkpoint to resume from: another trainer may be writing the next one.
  const std::optional<checkpoint::RunDirectoryLock> lock = lock_output_dir();
  peak_flops_ = job_peak_flops(t.peak_tflops, parts_.layout.device);
  fs::create_directories(t.output_dir);
  if (auto dir = resume_directory()) resume_from(*dir);
  const bool main = parts_.layout.is_main();
  // Rank 0 writes the run's files; every rank holds the same weights and optimizer state.
  std::optional<MetricsLog> metrics;
  if (main) {
    checkpoint::write_text_file_durable(t.output_dir + "/job.yaml", config::to_yaml(job_));
    std::optional<fs::path> tensorboard_dir;
    if (job_.tools.tensorboard) tensorboard_dir = fs::path(t.output_dir) / "tensorboard";
    metrics.emplace(t.output_dir, step_, tensorboard_dir);
    if (const auto events = metrics->tensorboard_path())
      spdlog::info("TensorBoard events: {}", events->string());
  }
  // At the end of every run, rank 0 draws the loss curve from the whole metrics.jsonl.
  auto plot_losses = [&] {
    const fs::path png = fs::path(t.output_dir) / "loss.png";
    if (metrics && write_loss_plot(metrics->path(), png))
      spdlog::info("wrote the loss curve to {}", png.string());
  };
  spdlog::info(
      "training {} parameters ({} trainable) for {} steps, global batch {} = {} data-parallel ranks x {} "
      "x {} micro-batches",
      models::parameter_count(parts_.model->module()), models::parameter_count(parts_.model->module(), true),
      t.steps, t.global_batch_size, parts_.layout.data_parallel(), accumulation_, t.micro_batch_size);

  // One loader item is one step's micro-batches on this rank, so the data position is the step.
  const core::Task& task = *parts_.task;
  StepFeed loader(task, job_.data, parts_.layout.device, step_, t.steps);
  ProgressBar progress(t.steps, job_.tools.log_every, step_, stderr,
                       !main                     ? ProgressBar::Mode::off
                       : job_.tools.progress_bar ? ProgressBar::Mode::automatic
                                                 : ProgressBar::Mode::lines);
  const auto start = Clock::now();
  // Time the steps spent waiting for the loader, over all their time (this run's steps).
  double total_data_wait = 0, total_step_time = 0;
  double total_grad_sync = 0;                            // waiting for gradient communication after backward
  double total_receive_wait = 0;                         // waiting for other ranks' activations
  int64_t overlong_truncated = 0, overlong_dropped = 0;  // this run's over-long training samples
  int64_t skipped = 0;                                   // and its unusable ones
  auto log_loader_share = [&] {
    spdlog::info(
        "loader share of step time: {:.2f}% ({:.2f} s waiting for data in {:.1f} s of steps); "
        "over-long samples: {} truncated, {} dropped; unusable samples skipped: {}",
        100.0 * total_data_wait / std::max(total_step_time, 1e-9), total_data_wait, total_step_time,
        overlong_truncated, overlong_dropped, skipped);
    for (const std::string& line : plan_.summary(total_receive_wait, total_grad_sync, total_step_time))
      spdlog::info("{}", line);
  };
  while (step_ < t.steps) {
    const auto step_start = Clock::now();
    const double wait_before = loader.wait_seconds();
    const core::StepData step_data = loader.next();
    const double data_wait = loader.wait_seconds() - wait_before;

    const double lr = learning_rate(step_, t.steps, t.warmup_steps, t.lr, t.min_lr);
    auto stats = train_step(step_data);
    skipped += stats.skipped;
    if (stats.truncated + stats.dropped > 0) {
      overlong_truncated += stats.truncated;
      overlong_dropped += stats.dropped;
      spdlog::warn(
          "step {}: {} samples over data.max_seq_len {} were {} (this run so far: {} truncated, {} "
          "dropped)",
          step_ + 1, stats.truncated + stats.dropped, job_.data.max_seq_len,
          job_.data.overlong == "drop" ? "dropped" : "truncated", overlong_truncated, overlong_dropped);
    }
    // Every rank has the same loss and norm (summed over the ranks), so every rank decides alike.
    const bool finite = std::isfinite(stats.loss) && std::isfinite(stats.grad_norm);
    if (finite) {
      plan_.optimizer->step(lr);
      if (stats.layer_picks.defined())
        parts_.model->end_step(stats.layer_picks);  // routing state (expert bias)
    } else {
      skip_nonfinite_step(stats.loss, stats.grad_norm);
    }
    ++step_;

    const double seconds = seconds_since(step_start);
    total_data_wait += data_wait;
    total_step_time += seconds;
    total_grad_sync += stats.grad_sync_s;
    total_receive_wait += stats.receive_wait_s;
    const double tokens_per_s = stats.tokens / seconds, samples_per_s = stats.samples / seconds;
    const double step_mfu = mfu(stats.flops, seconds);
    if (metrics) {
      nlohmann::json record = {{"step", step_},
                               {"loss", stats.loss},
                               {"lr", lr},
                               {"grad_norm", stats.grad_norm},
                               {"tokens_per_s", tokens_per_s},
                               {"samples_per_s", samples_per_s},
                               {"mfu", step_mfu},
                               {"step_time_s", seconds},
                               {"data_wait_s", data_wait},
                               {"grad_sync_s", stats.grad_sync_s},
                               {"skipped_nonfinite", skipped_nonfinite_}};
      if (step_data.context_parallel > 0) record["cp"] = step_data.context_parallel;  // picked per step
      if (stats.expert_load > 0) record["expert_load"] = stats.expert_load;
      if (!stats.expert_tokens.empty()) {
        record["expert_tokens"] = stats.expert_tokens;
        record["expert_dropped"] = stats.expert_dropped;
      }
      if (stats.ep_rank_load > 0) {
        record["ep_rank_load"] = stats.ep_rank_load;
        record["ep_rank_load_unreplicated"] = stats.ep_rank_load_unreplicated;
      }
      metrics->write(record);
    }
    progress.update(step_, stats.loss, lr, tokens_per_s, samples_per_s, step_mfu, seconds_since(start));
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
      plot_losses();
      return std::nullopt;
    }
  }
  progress.finish();
  log_loader_share();
  auto result = evaluate();
  log_eval(result, metrics ? &*metrics : nullptr);
  plot_losses();
  return result;
}

core::Evaluation Trainer::evaluate() {
  // Ranks may evaluate different batches for different numbers of steps, so sharded weights are made
  // whole once rather than gathered per layer (inference holds no gradients or optimizer state).
  WholeParameters whole(*plan_.gradients);
  return parts_.task->evaluate(in_training_ ? step_ : -1);
}

void Trainer::log_eval(const core::Evaluation& result, MetricsLog* metrics) {
  if (metrics && !result.metrics.empty()) {
    nlohmann::json line = {{"step", step_}};
    for (const auto& [name, value] : result.metrics) line[name] = value;
    metrics->write(line);
  }
  spdlog::info("step {}: {}", step_, result.summary);
}

void write_records(const core::Evaluation& result, const std::string& path) {
  std::string text;
  for (const nlohmann::json& record : result.records) text += record.dump() + "\n";
  checkpoint::write_text_file_durable(path, text);
}

}  // namespace loom::train
