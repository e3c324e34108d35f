// Training of a vision-language model from a job config, in one process or data-parallel over
// several: the step loop with gradient accumulation, AdamW, schedule and clipping, progress and
// metrics, periodic evaluation, and atomic checkpoints that a later run resumes from exactly.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/dist/comm.h"
#include "loom/dist/grad_reducer.h"
#include "loom/dist/parallel_state.h"
#include "loom/models/qwen2_vl/model.h"
#include "loom/parallel/fsdp.h"
#include "loom/train/job_data.h"
#include "loom/train/optimizer.h"
#include "loom/train/sharded_adamw.h"

namespace loom::train {

// One held-out question with the model's greedy answer.
struct EvalPrediction {
  std::string question, answer, predicted, question_type;
};

struct EvalResult {
  int64_t samples = 0;
  double accuracy = 0;                     // exact match of the generated answer
  std::map<std::string, double> per_type;  // accuracy per question type
  std::map<std::string, int64_t> per_type_samples;
  std::vector<EvalPrediction> predictions;  // in eval order
};

class MetricsLog;

// The model architecture a job asks for (model.hf_config as a path or inline fields).
models::Qwen2VLConfig job_model_config(const config::JobConfig& job);

// Checks the job's parallel layout against its model and `world_size` processes (validate_parallel):
// a one-line ConfigError before any work.
void validate_layout(const config::JobConfig& job, int64_t world_size);
// The same for the job's model architecture already read (job_model_config).
void validate_layout(const config::JobConfig& job, const models::Qwen2VLConfig& model, int64_t world_size);

// A collated or packed batch as the model's inputs.
models::VisionLanguageInputs model_inputs(const data::Batch& batch);

// What `loom bench` measures over its timed steps (after warm-up): rates, the median step time,
// MFU, this process's peak resident memory, and where the time went (seconds summed over the
// timed steps; communication is the wait for the gradient reduction after backward).
struct BenchResult {
  int64_t steps = 0, warmup = 0, ranks = 1;
  double tokens_per_s = 0, samples_per_s = 0, step_time_median_s = 0, mfu = 0, sgemm_gflops = 0;
  double peak_rss_mib = 0;
  double total_s = 0, data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, communication_s = 0;
};

class Trainer {
 public:
  // `comm`: the data-parallel group, or null for one process. Every rank of a group builds the same
  // model, takes its share of each step's samples and of the held-out set, and sums gradients.
  explicit Trainer(config::JobConfig job, std::shared_ptr<dist::Comm> comm = nullptr);
  ~Trainer();

  // Trains to training.steps (resuming per training.resume), evaluating and saving on schedule.
  // Returns the final evaluation, or nothing when training.exit_interval stopped the run early.
  std::optional<EvalResult> train();
  // Runs `warmup` + `steps` training steps from the job's initial weights (no resume, checkpoint,
  // metrics or evaluation; nothing is written) and measures the last `steps`.
  BenchResult bench(int64_t warmup, int64_t steps);
  // Writes what a peer implementation needs to train the same model on the same batches, in one
  // process: the job's initial weights with their config (`dir`/model/), the training settings
  // (`dir`/job.json) and each of the first `steps` steps' micro-batches with their M-RoPE position
  // ids (`dir`/steps/step-NNNNNN.safetensors, tensors "<micro-batch>.<field>").
  void export_steps(const std::string& dir, int64_t steps);
  // Exact-match accuracy of greedy answers on the held-out split (shared out over the ranks; every
  // rank gets the whole result).
  EvalResult evaluate();
  // Replaces the weights by those of a checkpoint or model directory.
  void load_weights(const std::string& dir);

  int64_t step() const { return step_; }
  const models::Qwen2VLForConditionalGeneration& model() const { return *model_; }

 private:
  struct StepStats;
  StepStats train_step(const std::vector<data::Batch>& micro_batches);
  void optimizer_step(double lr);  // the update, then the gradients are dropped
  void save_checkpoint();
  void dump_gradients() const;  // tools.dump_gradients
  void resume_from(const std::string& dir);
  std::optional<std::string> resume_directory() const;
  void log_eval(const EvalResult& result, MetricsLog* metrics);  // metrics line and console
  // Element-wise sums over the data-parallel ranks (the values themselves for one process).
  std::vector<double> sum_over_ranks(std::vector<double> values) const;

  bool is_main() const { return !comm_ || comm_->rank() == 0; }
  // Bytes this rank holds between steps for the trainable parameters, their gradients and the
  // optimizer state, and a line saying so.
  struct ModelStateBytes {
    int64_t parameters = 0, gradients = 0, optimizer = 0;
    int64_t total() const { return parameters + gradients + optimizer; }
  };
  ModelStateBytes model_state_bytes() const;

  config::JobConfig job_;
  std::shared_ptr<dist::Comm> comm_;               // every rank: barriers, evaluation
  std::unique_ptr<dist::ParallelState> parallel_;  // with comm_: the layout's groups
  std::shared_ptr<dist::Comm> data_comm_;          // with comm_: dp x cp, which sums gradients
  parallel::TensorParallelGroup tp_;               // the LLM's tensor-parallel group (null comm: tp 1)
  // Trainable parameters by their place in trainable_: each one's share of its squared gradient
  // norm in the sum over tp_ (0: whole on every rank, counted once; 1: a slice; 1/n: a slice n ranks
  // hold alike). Those whose gradient is a partial sum over tp_ (sequence parallelism), and the
  // replicated kv slices whose gradient is a partial sum over the ranks holding them: summed after
  // backward.
  std::vector<double> tp_share_;
  std::vector<at::Tensor> tp_partial_;
  std::vector<std::pair<at::Tensor, parallel::ShardLayout>> tp_replicated_;
  std::unique_ptr<dist::GradReducer> reducer_;  // with comm_: sums the gradients over the ranks
  models::Qwen2VLConfig model_config_;
  std::shared_ptr<models::Qwen2VLForConditionalGeneration> model_;
  std::map<std::string, parallel::ShardLayout> layouts_;  // how each parameter is cut from its whole tensor
  std::unique_ptr<JobData> data_;
  std::shared_ptr<parallel::FullyShardedModel> fsdp_;  // parallel.zero=3 over several ranks
  std::unique_ptr<AdamW> optimizer_;                   // one of these two:
  std::unique_ptr<ShardedAdamW> sharded_;              // parallel.zero=1 or 3 over several ranks
  std::vector<at::Tensor> trainable_;
  std::vector<std::string> trainable_names_;
  int64_t step_ = 0;
  int64_t dp_ = 1;            // data-parallel ranks
  int64_t accumulation_ = 1;  // micro-batches per rank and step
  double peak_flops_ = 0;
};

// Prints an evaluation as the final report: overall and per question type.
void print_eval(const EvalResult& result);
// Writes one JSON line per prediction (question, answer, predicted, question_type), atomically.
void write_predictions(const EvalResult& result, const std::string& path);

}  // namespace loom::train
