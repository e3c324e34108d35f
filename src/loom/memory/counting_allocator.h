// Counts the CPU memory that tensors hold, for loom bench's memory table: the bytes allocated by the
// threads that opted in (the training thread: not the data loader's workers, whose prefetched
// batches are not the step's memory, nor the threads of parallel kernels), live and at their peak.
//
// Installed once per process as libtorch's CPU allocator, in front of the one it replaces; every
// CPU allocation after that passes through it, and a block counted when allocated is uncounted
// when freed, on whichever thread frees it. Tensors allocated before it was installed are not in the
// figures.
#pragma once
#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace loom::memory {

class CountingAllocator final : public c10::Allocator {
 public:
  // Installs the process's counting allocator (the first call) and returns it.
  static CountingAllocator& install();
  // The installed one, or null.
  static CountingAllocator* installed();

  // Counts this thread's allocations while alive.
  class Scope {
   public:
    Scope();
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    bool previous_;
  };

  // Whether this thread's allocations are counted (a Scope is alive on it).
  static bool counts_this_thread();

  int64_t live_bytes() const { return live_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }
  // Starts a new peak from the live bytes.
  void reset_peak() { peak_.store(live_.load()); }

  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, size_t count) const override;
  // Its pointers are plain (their context is the data), as raw_allocate asks.
  c10::DeleterFnPtr raw_deleter() const override;

 private:
  CountingAllocator() = default;
  static void release(void* data);

  mutable std::atomic<int64_t> live_{0}, peak_{0};
};

}  // namespace loom::memory
