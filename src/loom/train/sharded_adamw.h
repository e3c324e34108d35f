// AdamW over parameters sharded across the data-parallel ranks (ZeRO): each rank keeps only its
// slice of the fp32 master weights, of both moments and of the summed gradient, in one or more
// parallel::FlatShard layouts, and applies AdamW's arithmetic, element for element, to that slice.
//
// ZeRO-1 (distributed optimizer): one shard over every trainable parameter, which stays whole on
// every rank. A step reduce-scatters the gradients (each rank receives the sum of its slice), clips
// by the global norm, updates the slice, and all-gathers the updated weights into the parameters.
// With AdamWOptions::split_master (every parameter bf16) the master slice lives between steps as a
// 16-bit residual beside the parameters' own slice (memory/fp32_reuse.h), joined for the step.
// FSDP (ZeRO-3): the shards are the FSDP units' (parallel/fsdp.h), whose gradients the FSDP engine
// reduce-scatters; the optimizer only clips and updates, and FSDP gathers the parameters when a
// forward pass needs them.
//
// Checkpoints hold the whole state in AdamW's own format (same keys, full shapes), so a run saved
// under ZeRO-1 or FSDP resumes under plain data parallelism or another rank count, and the other
// way round.
//
// Loom keeps it beside AdamW in train/, not in parallel/: it is an optimizer and shares AdamW's
// update and state format; it wraps no model code.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "loom/dist/comm.h"
#include "loom/parallel/flat_shard.h"
#include "loom/train/optimizer.h"

namespace loom::train {

class ShardedAdamW {
 public:
  // ZeRO-1 over `params`.
  ShardedAdamW(std::shared_ptr<dist::Comm> comm, std::vector<NamedParam> params, AdamWOptions options);
  // Over shards whose gradients someone else fills (FSDP). Every rank passes the same layouts.
  ShardedAdamW(std::shared_ptr<dist::Comm> comm, std::vector<std::shared_ptr<parallel::FlatShard>> shards,
               AdamWOptions options);

  // ZeRO-1: sums every parameter's gradient over the ranks into this rank's slice (missing
  // gradients count as zeros), then clip_gradients(max_norm). Every rank calls it, once per step.
  double reduce_gradients(double max_norm);
  // The reduce-scatter alone (ZeRO-1): clip_gradients must follow before step.
  void reduce_scatter_gradients();
  // Clips the shards' gradients by the norm of the whole summed gradient (max_norm 0: no clipping)
  // and returns that norm; learns which parameters got a gradient on any rank (the others are left
  // alone by step, as AdamW leaves a parameter without a gradient). Every rank calls it, once per
  // step, before step.
  double clip_gradients(double max_norm);
  // clip_gradients in two parts, for a norm over several optimizers' parameters: the squared norm of
  // the whole summed gradient of this one's (a collective; it learns which parameters got a
  // gradient), then every shard's gradient scaled by max_norm / (norm + 1e-6) when `norm` is over
  // max_norm > 0.
  double gradient_square();
  void clip_to(double norm, double max_norm);
  // Tensor parallelism: the parameters are this rank's slices over `tp`. Those named in `share`
  // are cut (each rank's squared gradient norm counts `share` times in the sum over tp: 1, or 1/n
  // for a slice n ranks hold alike); the others are whole and the same on every rank of tp.
  void set_tensor_parallel(std::shared_ptr<dist::Comm> tp, std::map<std::string, double> share);
  // Under pipeline parallelism: the norm sums over the `pipeline` group, without `uncounted` (copies of
  // parameters another stage counts).
  void set_pipeline(std::shared_ptr<dist::Comm> pipeline, std::set<std::string> uncounted);
  // Updates this rank's slices at learning rate `lr`; ZeRO-1 then gathers the parameters.
  void step(double lr);
  // Drops the parameters' gradients (ZeRO-1) and zeroes the shards'.
  void zero_grad();

  // The whole state, gathered from every rank (every rank must call it), in AdamW::state_dict()'s
  // keys and shapes.
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  // Takes this rank's slices of a whole state in AdamW's format (checked like AdamW's: nothing
  // changes on a bad one). Call after the weights are loaded: fp32 parameters are their own master
  // weights (ZeRO-1 takes them from the parameters; FSDP has already sharded them).
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state);

  int64_t step_count() const { return step_; }
  // Bytes this rank holds for the optimizer: its slices of the master weights (or of their
  // residuals, with options.split_master) and both moments.
  int64_t state_bytes() const;

 private:
  struct Slot {
    std::shared_ptr<parallel::FlatShard> shard;
    at::Tensor exp_avg, exp_avg_sq;  // fp32 [slice]
    at::Tensor decays;               // bool [slice]: weight decay applies
    at::Tensor updates;              // bool [slice]: got a gradient on some rank; undefined: all did
    // ZeRO-1 with options.split_master: the master slice held as the residual beside the bf16
    // parameters' own slice (shard->master is then undefined between steps).
    memory::SplitMaster split;
  };
  void add(std::shared_ptr<parallel::FlatShard> shard);
  // The fp32 master slice of a split slot: the parameters' slice joined with its residual.
  at::Tensor joined_master(const Slot& s) const;
  // Holds `master` as the residual beside the parameters' slice (which must be its rounding).
  static void split_master(Slot& s, const at::Tensor& master);
  bool split() const { return zero1_ && options_.split_master; }
  std::vector<NamedParam> named(const parallel::FlatShard& shard) const;
  at::Tensor gather(const at::Tensor& slice) const;  // the whole flat vector of a per-rank slice

  std::shared_ptr<dist::Comm> comm_;
  std::shared_ptr<dist::Comm> tp_;          // null: tp 1
  std::map<std::string, double> tp_share_;  // the cut parameters' shares of the norm
  std::shared_ptr<dist::Comm> pipeline_;    // null: pp 1
  std::set<std::string> uncounted_;
  std::vector<Slot> slots_;
  bool zero1_ = false;  // the parameters are whole: gather into them after a step
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace loom::train
