// What the trainer sees of a task, whatever it trains: how a step's data is made, how one
// micro-batch's forward pass ends in a loss sum with its counts, what evaluation is, and what a
// checkpoint carries besides the weights. The trainer normalises the loss by the step's count
// summed over the data-parallel ranks before any backward, so gradients do not depend on how the
// step is split into micro-batches or over ranks.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/layer.h"

namespace loom::core {

// One micro-batch as its task made it; the trainer hands it back to the task, after moving its
// device inputs to the job's device.
class MicroBatch {
 public:
  virtual ~MicroBatch() = default;
  // The tensors the task's forward computes with on the job's device, as the loader made them on the
  // host (what only the host reads, such as the token ids positions are worked out from, is left
  // out). For a GPU job the loader pins them and the trainer copies them to the GPU a step ahead,
  // each replaced by its copy (core/device.h, InputStager); the task moves what is still on the host.
  virtual std::vector<at::Tensor*> device_inputs() { return {}; }
};

// One training step's data on this rank.
struct StepData {
  std::vector<std::shared_ptr<MicroBatch>> micro_batches;
  double loss_count = 0;  // this rank's share of what normalises the step's loss
  // The context-parallel degree the step runs at, when the task picks it per step (dynamic context
  // parallelism: Layout::counts_data's degree); 0: the job's parallel.cp.
  int64_t context_parallel = 0;
  // This rank's share of the step's samples left out or cut: over data.max_seq_len (truncated or
  // dropped, as data.overlong says), and unusable ones skipped. The trainer sums them over the
  // data-parallel ranks; a task whose every rank reads the whole step reports its counts on data rank
  // 0 alone.
  int64_t truncated = 0, dropped = 0, skipped = 0;
};

// One micro-batch's forward pass through a stage.
struct ForwardResult {
  at::Tensor loss_sum;  // the last stage's: a differentiable scalar, the sum the step's count normalises
  Carry output;         // any other stage's: what the next stage takes
  int64_t tokens = 0, samples = 0;
  double flops = 0;  // training FLOPs (forward + backward) of this micro-batch
  // The last stage's, for a mixture-of-experts model (Model::experts()): per routed layer, the picks
  // each expert got, the picks dropped over capacity, and under expert parallelism the rows of the
  // most loaded ep rank before and after hot-expert replication and the ranks' mean (each summed over
  // the layer's passes), (Model::routed_layers(), E + 4) fp32,
  // over this rank's share of the micro-batch's tokens (a context-parallel rank's part; whole on every
  // tensor-parallel rank).
  at::Tensor expert_tokens;
};

// An evaluation on held-out data, the same on every rank.
struct Evaluation {
  int64_t samples = 0;                                  // 0: nothing was held out
  std::vector<std::pair<std::string, double>> metrics;  // by their metrics.jsonl names
  std::string summary;                                  // one log line
  std::string report;                                   // the final report, printed as it is
  std::vector<nlohmann::json> records;                  // one per held-out sample, in order
};

class Task {
 public:
  virtual ~Task() = default;
  // This rank's share of training step `step` (0-based). Called from loader threads, several at once.
  virtual StepData step_data(int64_t step) const = 0;
  // What StepData::loss_count counts, for messages ("target tokens").
  virtual std::string loss_count_name() const = 0;
  // Runs one micro-batch's forward pass through `stage` from `input` (empty on the first stage):
  // to its loss sum on the last stage, to the carry the next stage takes on any other. The task
  // builds the context the stage's layers read from the micro-batch.
  virtual ForwardResult forward(const MicroBatch& batch, const Stage& stage, Carry input) = 0;
  // Evaluates the model on the held-out data, its parameters whole (every rank calls it). `step`: the
  // training step whose weights these are, or -1 outside training (loom eval); a task that writes
  // what it samples (videos) names the folder by it.
  virtual Evaluation evaluate(int64_t step) = 0;
  // Writes what a checkpoint carries besides weights and training state (a tokenizer, processor
  // settings) into `dir`.
  virtual void save_artifacts(const std::string& dir) const = 0;
  // The training samples one pass over the data holds (training.epochs counts these passes); 0 for
  // data without epochs (a generated set).
  virtual int64_t epoch_samples() const = 0;
  // For `loom data export`: step `step`'s micro-batches for one process holding the whole global
  // batch, as the tensors a peer implementation trains on, named "<micro-batch>.<field>". Empty: this
  // task has nothing a peer reads (the command says so).
  virtual std::vector<std::pair<std::string, at::Tensor>> export_step(int64_t step) const {
    (void)step;
    return {};
  }
};

}  // namespace loom::core
