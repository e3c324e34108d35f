// A layout's gradient sync, composed of one part per parallel mode. Each part does its mode's
// share of a step: the bucketed all-reduce over each gradient group, ZeRO-1's reduce-scatters, FSDP's
// gathers and reduce-scatters, tensor parallelism's partial and replicated-slice sums, a pipeline's
// shared-parameter sums, expert slices made whole. apply_parallelism picks the parts a layout needs,
// in the order their work must come; ComposedSync calls every part's hook in that order (releases and
// reshards in the reverse one). A mode added later is one part more, not a branch in each hook.
//
// The global gradient norm sums over the parts that hold gradients: ZeRO-1's and FSDP's sharded
// optimizers, or WholeGradientNorm over whole (or tensor- and expert-sliced) gradients.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "loom/dist/comm.h"
#include "loom/parallel/tensor.h"
#include "loom/train/plan.h"
#include "loom/train/schedule.h"

namespace loom::dist {
class GradReducer;
}
namespace loom::parallel {
class FullyShardedModel;
}

namespace loom::train {

class PipelinePlacement;
class ShardedAdamW;

// One parallel mode's part of the gradient sync. Every hook does nothing unless the mode needs it.
class SyncPart {
 public:
  virtual ~SyncPart() = default;
  // Whether every data rank must learn the others' micro-batch counts (then each makes as many passes
  // as the rank with the most), and the check this mode makes of them (every rank throws alike).
  virtual bool pairs_passes() const { return false; }
  virtual void check_passes(const std::vector<int64_t>& per_rank) const { (void)per_rank; }
  virtual void begin_pass() {}
  virtual double end_pass() { return 0.0; }  // seconds waited
  virtual void before_backward(bool last) { (void)last; }
  virtual double reduce() { return 0.0; }  // after the passes: seconds waited or spent
  // The squared norm of the gradients this part holds, over every rank (a collective), then the
  // scaling of them to a clipped norm. Parts that hold no gradients add nothing.
  virtual double gradient_square() { return 0.0; }
  virtual void clip_to(double norm, double max_norm) {
    (void)norm;
    (void)max_norm;
  }
  virtual void gather() {}
  virtual void release() {}
  virtual void reshard() {}
  // A log line on the communication it made (waited_s: the whole sync's), or "".
  virtual std::string summary(double waited_s, double step_s) const {
    (void)waited_s;
    (void)step_s;
    return "";
  }
};

// The parts in order: passes pair if any part asks, the hooks run in order (release and reshard in
// reverse: a part undoes its gathering before the parts it gathered after),
// the clip sums the parts' squares.
class ComposedSync : public GradientSync {
 public:
  // `data`: the data-parallel group (null: one process); `layouts`: how the model's parameters lie
  // (for whole_gradients), `trainable` and `names` this rank's trainable parameters.
  ComposedSync(std::shared_ptr<dist::Comm> data, std::map<std::string, parallel::ShardLayout> layouts,
               std::vector<at::Tensor> trainable, std::vector<std::string> names);
  void add(std::shared_ptr<SyncPart> part) { parts_.push_back(std::move(part)); }

  std::pair<size_t, double> passes_and_total(size_t local, double count) override;
  void begin_pass() override;
  double end_pass() override;
  void before_backward(bool last) override;
  double reduce() override;
  double clip(double max_norm) override;
  void gather_parameters() override;
  void release_parameters() override;
  void reshard_from_parameters() override;
  std::vector<std::pair<std::string, at::Tensor>> whole_gradients() const override;
  std::string summary(double waited_s, double step_s) const override;

 private:
  std::shared_ptr<dist::Comm> data_;
  std::map<std::string, parallel::ShardLayout> layouts_;
  std::vector<at::Tensor> trainable_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<SyncPart>> parts_;
};

// Data parallelism without sharding: a bucketed all-reduce per gradient group that spans ranks (the
// data group's; the experts' over the expert-data group), overlapped with the last backward.
class AllReduceGradients : public SyncPart {
 public:
  AllReduceGradients(int64_t bucket_mb, bool overlap);
  ~AllReduceGradients() override;
  // `what`: the group's name in the summary ("" for the data group).
  void add_group(std::shared_ptr<dist::Comm> group, std::vector<at::Tensor> params, std::string what);
  void before_backward(bool last) override;
  double reduce() override;
  std::string summary(double waited_s, double step_s) const override;

 private:
  std::vector<std::unique_ptr<dist::GradReducer>> reducers_;
  std::vector<std::string> names_;
  int64_t bucket_mb_;
  bool overlap_;
};

// The global norm of whole gradients, each parameter's squares summed over its own group (NormShare).
class WholeGradientNorm : public SyncPart {
 public:
  WholeGradientNorm(std::vector<at::Tensor> params, std::vector<NormShare> shares,
                    std::shared_ptr<dist::Comm> pipeline)
      : params_(std::move(params)), shares_(std::move(shares)), pipeline_(std::move(pipeline)) {}
  double gradient_square() override;
  void clip_to(double norm, double max_norm) override;

 private:
  std::vector<at::Tensor> params_;
  std::vector<NormShare> shares_;
  std::shared_ptr<dist::Comm> pipeline_;
};

// ZeRO-1: each gradient group's sharded optimizer reduce-scatters its gradients after the passes and
// holds its slice of them for the norm.
class Zero1Gradients : public SyncPart {
 public:
  explicit Zero1Gradients(std::vector<std::shared_ptr<ShardedAdamW>> groups) : groups_(std::move(groups)) {}
  double reduce() override;
  double gradient_square() override;
  void clip_to(double norm, double max_norm) override;
  std::string summary(double waited_s, double step_s) const override;

 private:
  std::vector<std::shared_ptr<ShardedAdamW>> groups_;
};

// FSDP: the units gather for each pass and reduce-scatter after it (under a pipeline, once for the
// whole schedule, after the shared parameters' stages summed their gradients); the optimizer's slices
// are the norm's.
class FsdpGradients : public SyncPart {
 public:
  FsdpGradients(std::shared_ptr<parallel::FullyShardedModel> fsdp, std::shared_ptr<ShardedAdamW> optimizer,
                std::shared_ptr<PipelinePlacement> pipeline, int64_t state_bytes)
      : fsdp_(std::move(fsdp)),
        optimizer_(std::move(optimizer)),
        pipeline_(std::move(pipeline)),
        state_bytes_(state_bytes) {}
  bool pairs_passes() const override { return true; }
  void begin_pass() override;
  double end_pass() override;
  double gradient_square() override;
  void clip_to(double norm, double max_norm) override;
  void gather() override;
  void release() override;
  void reshard() override;
  std::string summary(double waited_s, double step_s) const override;

 private:
  std::shared_ptr<parallel::FullyShardedModel> fsdp_;
  std::shared_ptr<ShardedAdamW> optimizer_;
  std::shared_ptr<PipelinePlacement> pipeline_;  // null: pp 1
  int64_t state_bytes_;
};

// Tensor parallelism: under sequence parallelism each rank holds part of the gradients of `partial`
// (whole parameters run on one sequence chunk per rank); a kv slice several ranks hold has on each
// its query heads' part (`replicated`). Both are summed over `tp`: on the whole gradients, or on FSDP's
// shards, where the ranks of a tensor-parallel group hold the same data-parallel slice of alike-shaped
// units. A layout with neither has no such part.
class TensorParallelSums : public SyncPart {
 public:
  TensorParallelSums(std::shared_ptr<dist::Comm> tp, std::set<std::string> partial,
                     std::map<std::string, parallel::ShardLayout> replicated,
                     std::vector<at::Tensor> trainable, std::vector<std::string> names,
                     std::shared_ptr<parallel::FullyShardedModel> fsdp)
      : tp_(std::move(tp)),
        partial_(std::move(partial)),
        replicated_(std::move(replicated)),
        trainable_(std::move(trainable)),
        names_(std::move(names)),
        fsdp_(std::move(fsdp)) {}
  double reduce() override;

 private:
  void sum_gradients();
  void sum_shards();
  std::shared_ptr<dist::Comm> tp_;
  std::set<std::string> partial_;
  std::map<std::string, parallel::ShardLayout> replicated_;
  std::vector<at::Tensor> trainable_;
  std::vector<std::string> names_;
  std::shared_ptr<parallel::FullyShardedModel> fsdp_;  // null: the sums are on the whole gradients
};

// Pipeline parallelism: a parameter on several stages (a tied embedding) sums its gradient over them
// (here after the passes; under FSDP, FsdpGradients does it before its reduce-scatter); the whole
// model is gathered over the stages for evaluation and saving. The interleaved schedule takes each
// rank's micro-batches in groups of pp.
class PipelineGradients : public SyncPart {
 public:
  PipelineGradients(std::shared_ptr<PipelinePlacement> pipeline, bool sum_after_passes,
                    int64_t interleave_group)
      : pipeline_(std::move(pipeline)),
        sum_after_passes_(sum_after_passes),
        interleave_group_(interleave_group) {}
  bool pairs_passes() const override { return interleave_group_ > 1; }
  void check_passes(const std::vector<int64_t>& per_rank) const override;
  double reduce() override;
  void gather() override;
  void release() override;

 private:
  std::shared_ptr<PipelinePlacement> pipeline_;
  bool sum_after_passes_;
  int64_t interleave_group_;  // 1: not interleaved
};

// Expert parallelism: every pass exchanges tokens with the other data ranks, so each makes the same
// number of passes; while the parameters are whole (evaluation, loading, saving) each expert parameter
// holds every expert, and its slice of them is kept aside. Gathered whole, an expert layer runs every
// expert on its own rank's tokens, so ranks may evaluate different batches.
class ExpertSlices : public SyncPart {
 public:
  struct Expert {
    at::Tensor param;
    parallel::ShardLayout layout;
    at::Tensor local;
  };
  ExpertSlices(int64_t ep, std::vector<Expert> experts) : ep_(ep), experts_(std::move(experts)) {}
  bool pairs_passes() const override { return true; }
  void check_passes(const std::vector<int64_t>& per_rank) const override;
  void gather() override;
  void release() override;
  void reshard() override;

 private:
  int64_t ep_;
  std::vector<Expert> experts_;
};

}  // namespace loom::train
