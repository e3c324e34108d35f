// fp32 master weights in the bf16 parameter's own memory: the master of a bf16 parameter is the
// parameter (its high 16 bits, the rounding to nearest even) plus a 16-bit residual (its low bits,
// as a signed difference), so the master costs 2 bytes per parameter instead of 4. The one residual
// 16 bits cannot hold, a tie rounded down (+0x8000, about one element in 2^17), is listed by index.
// The optimizer's fused step (kernels::adamw_step) decodes, updates and encodes in one pass; these
// are the plain split and join of whole tensors, for building, saving and loading the state.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace loom::memory {

struct SplitMaster {
  at::Tensor residual;        // int16, the parameter's shape: bits(master) - (bits(bf16) << 16)
  std::vector<int64_t> ties;  // sorted flat indices whose residual is +0x8000 (stored as -0x8000)
  int64_t bytes() const;
};

// Rounds the fp32 `master` into the bf16 tensor `bf16` (in place: its storage is kept) and returns
// the residual that joins them back. A NaN stays a NaN (not of its payload).
SplitMaster split_master(const at::Tensor& master, at::Tensor bf16);

// The fp32 master that `bf16` and `split` hold (a new tensor): join_master(split_master(w, b)) == w
// bit for bit, for every w that is not a NaN.
at::Tensor join_master(const at::Tensor& bf16, const SplitMaster& split);

}  // namespace loom::memory
