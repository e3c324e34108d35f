// AdamW with decoupled weight decay (PyTorch semantics): fp32 moments, and an fp32 master copy of
// every bf16 parameter so that small updates are not lost to bf16 rounding.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "loom/memory/fp32_reuse.h"

namespace loom::train {

// A trainable leaf tensor (fp32 or bf16, requires_grad) and its name, which keys the optimizer state.
struct NamedParam {
  std::string name;
  at::Tensor param;
};

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  // Hold each bf16 parameter's fp32 master as the parameter plus a 16-bit residual
  // (memory::SplitMaster): 2 bytes per parameter less, the same updates bit for bit.
  bool split_master = false;
};

// Adam's moment update and step of the fp32 tensor `w` by the fp32 gradient `g`, in place, at
// optimizer step `step` (1-based, for the bias corrections). Decoupled weight decay is the
// caller's, applied to `w` before.
void adam_update(at::Tensor& w, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, double lr,
                 int64_t step, const AdamWOptions& options);

// The entries of an AdamW state for `params` (AdamW::state_dict()'s keys), checked: every entry
// present once with the parameter's shape, an integer step, nothing else; otherwise
// CheckpointError naming the entry. Reads only the parameters' names, shapes and dtypes.
std::map<std::string, at::Tensor> checked_adamw_state(
    const std::vector<NamedParam>& params, const std::vector<std::pair<std::string, at::Tensor>>& state);

class AdamW {
 public:
  // Allocates the state (zeros) and the master copies at once, so state_bytes() is known up front.
  AdamW(std::vector<NamedParam> params, AdamWOptions options);

  // One update at learning rate `lr`. Counts one step for the whole optimizer (bias correction uses
  // it); parameters without a grad are left untouched.
  void step(double lr);
  // Drops every grad (undefined, not zeros), freeing its memory.
  void zero_grad();

  // Live state tensors (not copies: save or clone them before the next step):
  // "exp_avg.<name>", "exp_avg_sq.<name>", "master.<name>" (bf16 params only), and "step" (int64 scalar).
  // A split master is joined into a new fp32 tensor, so the entries are the same either way.
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  // Copies a state_dict() into this optimizer. Every entry must be present with the right shape and no
  // other entry may be present; otherwise CheckpointError naming the entry and nothing is changed.
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state);

  int64_t step_count() const { return step_; }
  // Bytes held by the moments and the master copies (or the residuals of split masters).
  int64_t state_bytes() const;

  // Weight decay applies to matrices and higher (dim >= 2), never to norm scales or biases.
  static bool decays(const NamedParam& p);
  // The checks the constructor makes (ConfigError for options, ModelError for parameters).
  static void check(const std::vector<NamedParam>& params, const AdamWOptions& options);

 private:
  struct Slot {
    NamedParam p;
    at::Tensor exp_avg;         // fp32, shape of p
    at::Tensor exp_avg_sq;      // fp32, shape of p
    at::Tensor master;          // fp32 copy of a bf16 p; undefined for fp32 p or a split master
    memory::SplitMaster split;  // a bf16 p's master beside p, with options.split_master
    bool decay = false;
  };
  std::vector<Slot> slots_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace loom::train
