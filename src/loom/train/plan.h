// The parallel plan, applied to a built model from outside: the stages this rank runs (the model's
// layers with the runners they go through: FSDP's gather and free), how the gradients are summed over the
// ranks (bucketed all-reduce overlapped with backward, ZeRO-1's reduce-scatter, FSDP's reduce-scatters, and
// tensor parallelism's partial and replicated-slice sums), the global gradient-norm clip, and the optimizer
// over whatever each rank holds. The trainer drives the two objects apply_parallelism returns and knows none
// of the modes.
//
// It sits in train/ beside the optimizers rather than in parallel/: ZeRO's reduce-scatter is the
// sharded optimizer's own, and parallel/ builds below the models it is applied to.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/model.h"
#include "loom/dist/comm.h"
#include "loom/dist/parallel_state.h"
#include "loom/train/optimizer.h"

namespace loom::parallel::pipeline {
class CarryExchange;
}

namespace loom::train {

// Bytes a rank holds between steps for the trainable parameters, their gradients and the optimizer
// state.
struct ModelStateBytes {
  int64_t parameters = 0, gradients = 0, optimizer = 0;
  int64_t total() const { return parameters + gradients + optimizer; }
};

// What a step's micro-batch passes meet (a schedule calls these), what follows them, and every
// parameter made whole outside passes.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // How many passes this rank makes when it holds `local` micro-batches (every rank calls it at
  // once: FSDP's ranks all make as many as the rank with the most, as their collectives pair).
  // Returned with the sum over the data-parallel ranks of `count`, which travels with it.
  virtual std::pair<size_t, double> passes_and_total(size_t local, double count) = 0;
  // Around one micro-batch's forward and backward (an empty pass has neither); end_pass returns
  // the seconds it waited for communication.
  virtual void begin_pass() = 0;
  virtual double end_pass() = 0;
  // Just before a pass's backward; `last`: the step's last micro-batch on this rank.
  virtual void before_backward(bool last) = 0;
  // After the passes: every gradient summed as the layout needs. Returns the seconds it waited.
  virtual double reduce() = 0;
  // The global gradient norm, each gradient scaled by max_norm / (norm + 1e-6) when over max_norm
  // > 0; every rank gets the same norm.
  virtual double clip(double max_norm) = 0;
  // Every parameter whole on every rank until release_parameters (a collective under FSDP).
  virtual void gather_parameters() = 0;
  virtual void release_parameters() = 0;
  // After new values were written into gathered parameters (loading weights).
  virtual void reshard_from_parameters() = 0;
  // Gradients whole by name, for dumping (a collective under tensor parallelism).
  virtual std::vector<std::pair<std::string, at::Tensor>> whole_gradients() const = 0;
  // A log line for the run's summary of the communication this layout made, or "".
  virtual std::string summary(double waited_s, double step_s) const = 0;
};

// The optimizer over this rank's share of the parameters; its state is saved and loaded whole (in
// AdamW's keys and the parameters' whole shapes), so a checkpoint resumes under any layout.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update at learning rate `lr`, then the gradients are dropped.
  virtual void step(double lr) = 0;
  // The gradients dropped without an update (a step whose loss or gradient norm is not finite).
  virtual void skip_step() = 0;
  // The whole state (a collective under ZeRO and tensor parallelism).
  virtual std::vector<std::pair<std::string, at::Tensor>> state_dict() const = 0;
  // Takes this rank's share of a whole state; CheckpointError naming the entry for a bad one.
  virtual void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) = 0;
};

// How a rank's stages run as part of a pipeline (the parallel state's pp group: rank r holds global
// stages r, r + pp, ...; no exchange: one stage holds every layer).
struct PipelineRun {
  std::shared_ptr<parallel::pipeline::CarryExchange> exchange;  // over the pp group, kept from step to step
  std::string schedule = "1f1b";      // 1f1b (interleaved with virtual stages) | gpipe
  bool recompute_in_bubbles = false;  // features.recompute_in_bubbles
};

struct AppliedPlan {
  std::shared_ptr<const dist::ParallelState> state;  // the parallel state it was applied over
  // The model's layers this rank runs, with their runners: one stage, or under pipeline parallelism
  // one per virtual stage in chunk order.
  std::vector<core::Stage> stages;
  PipelineRun pipeline;
  std::unique_ptr<GradientSync> gradients;
  std::unique_ptr<Optimizer> optimizer;
  ModelStateBytes bytes;  // this rank's, between steps

  bool pipelined() const { return state->pp() != nullptr; }
  // Whether this rank counts a step's samples, tokens and loss count when they are split over
  // `degree` ranks of its cp group (0: the job's cp): the first of those ranks.
  bool counts_samples(int64_t degree) const;
  // Whether this rank counts what the whole step read (truncated, dropped, skipped samples): every
  // stage of a pipeline read it, the last one counts it.
  bool counts_step() const;
  // `values` summed over the data-parallel ranks and the stages of the pipeline (a collective).
  std::vector<double> sum_over_ranks(std::vector<double> values) const;
  // Log lines for the run's summary of the communication this layout made in `step_s` seconds of
  // steps: `receive_wait_s` waited for other stages' activations, `grad_sync_s` for gradient sums.
  std::vector<std::string> summary(double receive_wait_s, double grad_sync_s, double step_s) const;
};

// Applies the job's parallel section to `model`, whose parameters named `trainable` train, over
// the job's parallel state: gradients are summed over its data group (data x context parallel; none
// for one process); tp is the group the model was built over; under pipeline parallelism this rank
// holds, trains and steps only its stages' parameters.
AppliedPlan apply_parallelism(core::Model& model, const std::vector<NamedParam>& trainable,
                              const config::JobConfig& job, std::shared_ptr<const dist::ParallelState> state);

// Every parameter whole for as long as it lives.
class WholeParameters {
 public:
  explicit WholeParameters(GradientSync& sync) : sync_(sync) { sync_.gather_parameters(); }
  ~WholeParameters() { sync_.release_parameters(); }
  WholeParameters(const WholeParameters&) = delete;
  WholeParameters& operator=(const WholeParameters&) = delete;

 private:
  GradientSync& sync_;
};

}  // namespace loom::train
