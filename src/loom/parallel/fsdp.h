// FSDP (ZeRO stage 3): every trainable parameter is sharded across the data-parallel ranks, and a
// rank holds whole parameters only while a layer that needs them runs.
//
// Units. Each layer the plan names (fsdp_plan: layer paths such as model.layers.{*}; by default the
// model's repeated blocks) is a unit of its own; every other trainable parameter (in the default
// plan: patch embedding, merger, token embedding, final norm, LM head) forms the root unit. A
// unit's trainable parameters are laid end to end in one flat buffer (parallel::FlatShard); each
// rank keeps its equal slice of it as fp32 master weights, and the parameters themselves become
// views of a whole buffer whose storage exists only while the unit is gathered. Frozen parameters
// stay whole on every rank.
//
// A training pass (one micro-batch: begin_pass, forward, backward, end_pass):
// - the root unit is gathered at the start of the pass and kept until its gradients are reduced;
// - a layer unit is all-gathered just before its forward (FullyShardedModel is the layer runner;
//   the next unit's gather is started at the same time, so it overlaps this layer's compute) and
//   freed right after it;
// - a hook on what the layer made gathers it again when backward reaches the layer (prefetching
//   the unit backward reaches next);
// - once every gradient of a unit is final, the gradients are flattened, reduce-scattered (each
//   rank receives the sum of its slice, added to the shard's gradient) and the whole gradients and
//   parameters are freed.
// Gathers and reduce-scatters travel on two process groups of their own, each in one fixed order
// on every rank (forward: root then layer units; backward: those in reverse, then root). A rank
// that skipped a unit (no images in its micro-batch) or a whole pass (fewer micro-batches) still
// takes part in that unit's collectives, with zero gradients, when end_pass closes the pass; so
// ranks never wait on each other's data.
//
// Outside a pass, gather_all() makes every parameter whole (evaluation, checkpoints, loading
// weights) until release_all(). Under pipeline parallelism a step is one gathered pass
// (begin_gathered_pass).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/core/layer.h"
#include "loom/dist/comm.h"
#include "loom/parallel/flat_shard.h"

namespace torch::autograd {
struct Node;
}

namespace loom::parallel {

// Whether a dotted module path matches an fsdp_plan pattern, part by part: a part {*} matches any
// integer and {a-b} an integer from a to b; any other part matches itself.
bool fsdp_plan_matches(const std::string& pattern, const std::string& path);
// Which of a model's layers (in forward order) the plan names; ConfigError for a pattern that names
// none, or names a layer whose parameters something outside it also reads.
std::vector<bool> fsdp_planned_layers(const std::vector<std::string>& plan, const core::Layers& layers);

class FullyShardedModel : public core::LayerRunner {
 public:
  // `params`: the model's trainable parameters by name; `layers`: its layers in forward order;
  // `plan`: the patterns naming the layers that are units of their own (fsdp_planned_layers). `comm`
  // is the data-parallel group; the gathers and reduce-scatters get two groups of their own formed
  // from it.
  FullyShardedModel(std::shared_ptr<dist::Comm> comm,
                    const std::vector<std::pair<std::string, at::Tensor>>& params, const core::Layers& layers,
                    const std::vector<std::string>& plan);
  ~FullyShardedModel() override;
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;

  // One micro-batch's forward and backward happen between these two; every rank makes the same
  // number of passes (an empty pass has no forward). end_pass returns the seconds it took: the
  // collectives of what this rank skipped, and the wait for the reduce-scatters still in flight.
  void begin_pass();
  double end_pass();

  // Under a pipeline schedule, which runs many micro-batches' forwards and backwards interleaved: the
  // units are gathered once for the whole schedule (the layers run whole, as under gather_all) and
  // their gradients, accumulated over it, reduce-scattered once after it (no resharding after
  // forward, as torchtitan does under pipeline parallelism). Collectives only here, so ranks with
  // different micro-batch counts pair. end_gathered_pass returns the seconds it took.
  void begin_gathered_pass();
  double end_gathered_pass();

  // Every parameter whole (collective), until release_all().
  void gather_all();
  void release_all();
  // After new values were written into the gathered parameters: each rank takes its slice of them.
  void reshard_from_parameters();

  core::Carry run(const core::Layer& layer, core::Carry carry,
                  const std::function<core::Carry(core::Carry)>& next) override;

  // The units' shards (root first), for the optimizer.
  std::vector<std::shared_ptr<FlatShard>> shards() const;
  std::vector<std::string> unit_names() const;
  // Bytes held between steps: the shards' fp32 master weights and gradients.
  int64_t shard_parameter_bytes() const;
  int64_t shard_gradient_bytes() const;
  // The most bytes held at once during passes for whole parameters, whole gradients not yet
  // reduced and reduce-scatter buffers.
  int64_t peak_transient_bytes() const { return peak_transient_; }

 private:
  struct Unit;
  void start_gather(size_t u);
  void wait_gather(size_t u);
  void free_unit(size_t u);
  void issue_forward_through(size_t position);
  void pass_over_forward_before(size_t u);
  void wait_for_reductions();
  void issue_backward_through(size_t position);
  void before_backward(size_t u);
  void on_gradient_ready(size_t u, size_t param);
  void start_ready_reductions();
  void start_reduce(size_t u);
  void account(int64_t bytes);
  void finish_reductions();  // the reduce thread's loop

  enum class Mode { sharded, pass, gathered, gathered_pass };
  double finish_pass(const std::chrono::steady_clock::time_point& begin);
  std::shared_ptr<dist::Comm> gather_comm_, reduce_comm_;
  std::vector<std::unique_ptr<Unit>> units_;  // root first, then layer units in forward order
  std::map<const core::Layer*, size_t> unit_of_;
  std::set<const core::Layer*> whole_layers_;  // layers with no trainable parameter
  // Backward order of the gathers (layer units in reverse) and of the reduce-scatters (then root).
  std::vector<size_t> backward_gathers_, reductions_;
  size_t forward_next_ = 0, backward_next_ = 0, reduce_next_ = 0;
  std::atomic<Mode> mode_{Mode::sharded};
  std::recursive_mutex mutex_;  // the pass's state, taken by the forward and the backward hooks
  std::mutex account_mutex_;
  int64_t transient_ = 0, peak_transient_ = 0;
  // Started reduce-scatters are finished (waited, added into the shard's gradient, their buffers
  // freed) by a thread of their own, in order, so their buffers go as soon as the collective is
  // done while no rank's forward or backward ever waits on one.
  std::thread reduce_thread_;
  std::mutex queue_mutex_;
  std::condition_variable queue_changed_;
  std::deque<size_t> queue_;  // units whose reduce-scatter is started and not finished
  bool finishing_ = false;    // a unit is being finished
  bool stopping_ = false;
  std::exception_ptr reduce_error_;
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
};

}  // namespace loom::parallel
