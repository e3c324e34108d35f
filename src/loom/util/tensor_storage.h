// A tensor whose memory comes and goes while the tensor (its shape, its identity for autograd and the
// modules holding it) stays: FSDP's gathered units, recompute's refilled outputs and the parameters
// another pipeline stage holds.
#pragma once
#include <ATen/ATen.h>

namespace loom {

// Whether `t` is its storage's only view, from its start (what emptying and refilling it assumes).
inline bool owns_storage(const at::Tensor& t) {
  return t.is_contiguous() && t.storage_offset() == 0 && t.storage().nbytes() == t.nbytes();
}

// Frees the storage's memory; the tensor keeps its shape, and must not be read until refilled.
inline void release_storage(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

// Gives an emptied storage new (uninitialised) memory for the whole of `t`.
inline void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace loom
