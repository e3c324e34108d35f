// ZeRO stage 1 (distributed optimizer): AdamW whose fp32 master weights and moments are split
// evenly over the data-parallel ranks. The trainable parameters are laid end to end in one flat
// fp32 vector (padded to a multiple of the rank count); rank r owns the r-th equal slice. A step
// reduce-scatters the gradients (each rank receives the sum of its slice), clips by the global
// norm, updates its slice with AdamW's arithmetic, and all-gathers the updated weights into every
// rank's parameters.
//
// Checkpoints hold the whole state in AdamW's own format (same keys, full shapes), gathered from
// every rank, so a run saved under ZeRO-1 resumes under plain data parallelism or another rank
// count, and the other way round.
//
// Loom keeps it beside AdamW in train/, not in parallel/: it is an optimizer and shares AdamW's
// update and state format; it wraps no model code.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/dist/comm.h"
#include "loom/train/optimizer.h"

namespace loom::train {

class ShardedAdamW {
 public:
  ShardedAdamW(std::shared_ptr<dist::Comm> comm, std::vector<NamedParam> params, AdamWOptions options);

  // Sums every gradient over the ranks into this rank's slice (missing gradients count as zeros)
  // and clips the slice by the norm of the whole summed gradient (max_norm 0: no clipping).
  // Returns that norm. Every rank calls it, once per step, after backward.
  double reduce_gradients(double max_norm);
  // Updates this rank's slice at learning rate `lr` and gathers the parameters from every rank.
  void step(double lr);
  void zero_grad();

  // The whole state, gathered from every rank (every rank must call it), in AdamW::state_dict()'s
  // keys and shapes.
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  // Takes this rank's slice of a whole state in AdamW's format (checked like AdamW's). Call after
  // the parameters themselves are loaded: fp32 parameters are their own master weights.
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state);

  int64_t step_count() const { return step_; }
  // Bytes this rank holds for the optimizer: its slice of the master weights and both moments.
  int64_t state_bytes() const;

 private:
  at::Tensor gather(const at::Tensor& slice) const;  // the whole flat vector of a per-rank slice

  std::shared_ptr<dist::Comm> comm_;
  std::vector<NamedParam> params_;
  std::vector<int64_t> offsets_;                     // where each parameter starts in the flat vector
  int64_t slice_ = 0, begin_ = 0;                    // elements per rank, this rank's first element
  at::Tensor master_, exp_avg_, exp_avg_sq_, grad_;  // fp32 [slice_]
  at::Tensor decays_;                                // bool [slice_]: weight decay applies
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace loom::train
