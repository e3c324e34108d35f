// Pipeline parallelism applied to a built model: which global stages (parallel/pipeline/cut.h) and
// so which layers and parameters this rank holds. Rank r of the pipeline group holds chunks r,
// r + pp, ... A parameter belongs to the stage of the layer it is under; one outside every layer (an
// untied LM head) to the last stage, which runs the task's head; a layer's whose parameters are read
// outside it (a tied token embedding, read by the LM head) to its own stage and the last. The
// parameters this rank does not hold keep their shapes but not their memory, until gather() makes
// every parameter whole on every rank of the pipeline (checkpoints, evaluation, loading weights)
// and release() frees them again. A parameter held on several ranks has its gradients summed over
// them (sum_shared_gradients) and is counted once in the global norm, by the first stage holding it.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/layer.h"
#include "loom/core/model.h"
#include "loom/dist/comm.h"
#include "loom/train/plan.h"

namespace loom::train {

class PipelinePlacement {
 public:
  // Cuts `model` over `pipeline` (the pipeline group) as job.model.pipeline_layers and
  // parallel.virtual_stages say (a collective over the ranks sharing a parameter: their group is
  // formed here), and frees the parameters this rank does not hold.
  PipelinePlacement(core::Model& model, const config::JobConfig& job, std::shared_ptr<dist::Comm> pipeline);

  const std::shared_ptr<dist::Comm>& comm() const { return comm_; }
  // This rank's chunks in chunk order, without runners.
  const std::vector<core::Stage>& chunks() const { return chunks_; }
  bool holds(const std::string& name) const { return held_.count(name) > 0; }
  // Whether this rank counts the parameter's gradient in the global norm.
  bool counts(const std::string& name) const { return holds(name) && !copies_.count(name); }
  // "model.pipeline_layers: {...}" as cut.
  const std::string& description() const { return description_; }
  // The fewest blocks any stage of the pipeline holds.
  int64_t fewest_blocks() const { return fewest_blocks_; }

  // Sums the gradients of the parameters held on several ranks over those ranks (zeros for a
  // missing one).
  void sum_shared_gradients();
  // Every parameter whole on every rank of the pipeline (a collective), until release().
  void gather();
  void release();

 private:
  std::shared_ptr<dist::Comm> comm_;
  std::vector<core::Stage> chunks_;
  std::string description_;
  int64_t fewest_blocks_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;  // the model's, in module order
  std::set<std::string> held_, copies_;  // held here; held here but counted by another rank
  // The groups of ranks holding parameters alike, with those parameters' names.
  std::vector<std::pair<std::shared_ptr<dist::Comm>, std::vector<std::string>>> shared_;
};

// `stages` (the optimizer over this rank's parameters) with the whole model's state: state_dict
// gathers every stage's entries onto every rank of the pipeline (a collective; each parameter's from
// the rank counting it, "step" from pipeline rank 0), load_state_dict takes this rank's parameters'
// entries. `trainable`: every trainable parameter's name, on any stage.
std::unique_ptr<Optimizer> pipelined_optimizer(std::unique_ptr<Optimizer> stages,
                                               std::shared_ptr<const PipelinePlacement> placement,
                                               std::set<std::string> trainable);

}  // namespace loom::train
