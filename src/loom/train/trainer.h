// The training loop, for any model, task and parallel layout: steps with the task's data through a
// schedule, the plan's gradient sync and clip, the optimizer with its learning-rate schedule,
// progress and metrics, periodic evaluation, and atomic checkpoints that a later run resumes from
// exactly, under this layout or another.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/checkpoint/run_lock.h"
#include "loom/config/config.h"
#include "loom/core/layout.h"
#include "loom/core/model.h"
#include "loom/core/task.h"
#include "loom/train/plan.h"

namespace loom::train {

class MetricsLog;

// A job's parts as the trainer takes them: the groups, and the model and task built over them.
struct JobParts {
  core::Layout layout;
  std::shared_ptr<core::Model> model;
  std::shared_ptr<core::Task> task;
};

// What `loom bench` measures over its timed steps (after warm-up): rates, the median step time,
// MFU, this process's peak resident memory, and where the time went (seconds summed over the
// timed steps; communication is the wait for the gradient reduction after backward).
struct BenchResult {
  int64_t steps = 0, warmup = 0, ranks = 1;
  double tokens_per_s = 0, samples_per_s = 0, step_time_median_s = 0, mfu = 0, sgemm_gflops = 0;
  double peak_rss_mib = 0;
  // Bytes: the model state from the plan (this rank's), the most a micro-batch's forward left
  // allocated for its backward, and the peak allocated in a timed step (with the model state), both
  // counted by loom bench's allocator (0 without it).
  int64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  int64_t activation_bytes = 0, peak_allocated_bytes = 0;
  // On a GPU: the device's name and its caching allocator's peaks over the timed steps (what tensors
  // held, and what the allocator held from CUDA); "cpu" and zeros otherwise.
  std::string device = "cpu";
  int64_t device_peak_allocated_bytes = 0, device_peak_reserved_bytes = 0;
  double total_s = 0, data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, communication_s = 0;
  // Under pipeline parallelism, each pipeline rank's timed steps (from every rank of the pipeline):
  // busy in its chunks' forwards and backwards, idle waiting for the stages before and after it, and
  // the most activation bytes its forwards held at once.
  struct PipelineRank {
    double busy_s = 0, idle_s = 0;
    int64_t activation_bytes = 0;
  };
  std::vector<PipelineRank> pipeline;
  // Under context parallelism, each cp rank's timed steps (from every rank of the group): the most
  // activation bytes its forwards held, and its ring attention's compute, exposed wait (blocked on a
  // message after a step's compute) and messages sent; and the seconds the same messages take around
  // the same ring alone (ring_alone_s, this rank's), so the hidden share is 1 - wait / alone.
  struct ContextRank {
    int64_t activation_bytes = 0;
    double ring_compute_s = 0, ring_wait_s = 0, ring_alone_s = 0;
    int64_t ring_bytes = 0;
  };
  std::vector<ContextRank> context;
  int64_t cp_ulysses = 1;
  // A mixture of experts, each ep rank's timed steps (from every rank of the group; one rank without
  // ep): the rows its experts computed, their grouped products' seconds and FLOPs, the forward
  // exchanges' bytes and the seconds blocked on them (the dispatch after the shared expert's work),
  // and the seconds the same exchanges take alone (this rank's), so the hidden share is 1 - wait /
  // alone; and the picks each expert got over the timed steps (every layer and rank).
  struct ExpertRank {
    int64_t rows = 0, bytes = 0;
    double compute_s = 0, flops = 0, wait_s = 0, alone_s = 0;
  };
  std::vector<ExpertRank> experts;
  std::vector<double> expert_tokens;
  int64_t micro_batches = 0, virtual_stages = 1;  // per step on this rank; model chunks per pipeline rank
};

class Trainer {
 public:
  // Builds the job's model and task through the registry over `comm` (every rank of the job; null
  // for one process).
  explicit Trainer(config::JobConfig job, std::shared_ptr<dist::Comm> comm = nullptr);
  // Trains parts built elsewhere. Every rank builds the same model, takes its share of each step's
  // data and of the held-out set, and the plan sums the gradients.
  Trainer(config::JobConfig job, JobParts parts);
  ~Trainer();

  // Trains to training.steps (resuming per training.resume), evaluating and saving on schedule.
  // Returns the final evaluation, or nothing when training.exit_interval stopped the run early.
  // Rank 0 holds training.output_dir's lock (checkpoint/run_lock.h) while it runs; a second
  // trainer on that directory is refused with a ConfigError on every rank (one all-gather).
  std::optional<core::Evaluation> train();
  // Runs `warmup` + `steps` training steps from the job's initial weights (no resume, checkpoint,
  // metrics or evaluation; nothing is written but `profile`: a Chrome trace of the timed steps when
  // not empty, train/profile.h) and measures the last `steps` (bench.cpp).
  BenchResult bench(int64_t warmup, int64_t steps, const std::string& profile = "");
  // The task's evaluation, every parameter whole (every rank gets the whole result): of the weights at
  // the current step during train(), of whatever load_weights loaded otherwise.
  core::Evaluation evaluate();
  // What loom train --check adds to building the job: the checkpoint train() would resume from,
  // loaded as train() loads it (weights, optimizer and trainer state); nothing is trained or written.
  std::optional<std::string> check();
  // Replaces the weights by those of a checkpoint or model directory.
  void load_weights(const std::string& dir);

  int64_t step() const { return step_; }
  const core::Model& model() const { return *parts_.model; }

 private:
  struct StepStats {
    double loss = 0, grad_norm = 0;
    int64_t tokens = 0, samples = 0;
    int64_t truncated = 0, dropped = 0, skipped = 0;  // the step's samples cut or left out (StepData's)
    double flops = 0;
    double grad_sync_s = 0;  // gradient communication not hidden behind backward, as the plan reports it
    double forward_s = 0, backward_s = 0;
    int64_t activation_bytes = 0;  // ScheduleResult's
    double receive_wait_s = 0;     // ScheduleResult's
    // A mixture of experts: the most tokens an expert got over the mean (every MoE layer's picks
    // pooled over the step); 1 is an even load. 0 for a dense model.
    double expert_load = 0;
    // The picks each expert got over the step (every MoE layer's and rank's added); empty: dense.
    std::vector<double> expert_tokens;
    double expert_dropped = 0;  // picks dropped over an expert's capacity (every layer and rank)
    // Expert parallelism: the most loaded ep rank's rows over the mean (every layer and pass pooled),
    // after hot-expert replication and before; 0 without ep.
    double ep_rank_load = 0, ep_rank_load_unreplicated = 0;
    at::Tensor layer_picks;  // (routed layers, experts) fp64: the picks of each layer's experts
  };
  StepStats train_step(const core::StepData& step);
  // A step whose loss or gradient norm is not finite: dropped without an update while
  // training.skip_nonfinite_steps allows, else a TrainingError naming the step.
  void skip_nonfinite_step(double loss, double grad_norm);
  void save_checkpoint();
  void dump_gradients() const;  // tools.dump_gradients
  void resume_from(const std::string& dir);
  std::optional<std::string> resume_directory() const;
  // training.output_dir's lock on rank 0, nothing on the others; every rank throws rank 0's refusal.
  std::optional<checkpoint::RunDirectoryLock> lock_output_dir() const;
  void log_eval(const core::Evaluation& result, MetricsLog* metrics);  // metrics line and console
  // Element-wise sums over the data-parallel ranks (the values themselves for one process).
  double mfu(double flops, double seconds) const;

  config::JobConfig job_;
  JobParts parts_;
  AppliedPlan plan_;  // how gradients are summed and clipped, and the optimizer
  std::vector<at::Tensor> trainable_;
  int64_t step_ = 0;
  bool in_training_ = false;       // evaluate() names the step only inside train()
  int64_t skipped_nonfinite_ = 0;  // over the whole run, resumes included (trainer_state.json)
  std::string last_saved_;         // the checkpoint this process last saved, for messages
  int64_t accumulation_ = 1;       // micro-batches per rank and step
  double peak_flops_ = 0;
};

// Writes the evaluation's records as JSON lines, atomically.
void write_records(const core::Evaluation& result, const std::string& path);

}  // namespace loom::train
