// Activation offload: the inputs a fully recomputed block keeps for its backward leave the
// training memory after its forward and come back, one block ahead, as backward approaches it.
//
// With full recompute a block's backward needs only its inputs (its hidden state as it came in);
// everything else it makes again. Offload moves those inputs out: each is copied to a spill file,
// and the node keeps only where it lies. When backward reaches a block, the block before it (in
// forward order) starts reading its inputs back on a thread of its own, so they are in memory by
// the time its recompute runs; a block whose read has not finished waits for it. Entries the block
// hands on unchanged (read by later layers) stay where they are, and so does anything that is not
// a whole contiguous CPU tensor.
//
// The spill file is an unlinked file in $TMPDIR (else /tmp): it holds the activations of one pass
// at a time and vanishes with the process. On a tmpfs it saves nothing: the pages stay in memory.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>

namespace loom::memory {

class SpillFile;

// One tensor moved out: its place in the spill file and what it was.
class OffloadedTensor {
 public:
  OffloadedTensor(std::shared_ptr<SpillFile> file, const at::Tensor& tensor);
  ~OffloadedTensor();
  OffloadedTensor(const OffloadedTensor&) = delete;
  OffloadedTensor& operator=(const OffloadedTensor&) = delete;

  // Starts reading it back on a thread of its own (once; later calls do nothing).
  void prefetch();
  // The tensor again, equal to what was moved out: waits for the prefetch, or reads it now. Once.
  at::Tensor take();

 private:
  at::Tensor read() const;

  std::shared_ptr<SpillFile> file_;
  int64_t offset_ = 0, nbytes_ = 0;
  std::vector<int64_t> sizes_;
  at::ScalarType dtype_;
  std::mutex mutex_;
  std::future<at::Tensor> pending_;
  bool taken_ = false;
};

// The offloaded inputs of one block's run, linked to the block run before it.
struct OffloadGroup {
  std::vector<std::shared_ptr<OffloadedTensor>> tensors;
  std::weak_ptr<OffloadGroup> previous;
  void prefetch() {
    for (auto& t : tensors) t->prefetch();
  }
};

// What the runner of one stage offloads into: its spill file and the last group it made.
class Offloader {
 public:
  // The spill file in $TMPDIR, else /tmp.
  Offloader();
  // Whether `tensor` can be moved out (a whole contiguous CPU tensor, its storage its own).
  static bool movable(const at::Tensor& tensor);
  // Moves `tensors` out as the group of the block that has just run; the next group made links
  // back to it.
  std::shared_ptr<OffloadGroup> move_out(const std::vector<at::Tensor>& tensors);
  // Bytes moved out so far and bytes read back ahead by a prefetch, over the whole run.
  int64_t bytes_moved() const;
  int64_t bytes_prefetched() const;
  const std::string& path() const;

 private:
  std::shared_ptr<SpillFile> file_;
  std::weak_ptr<OffloadGroup> last_;
};

}  // namespace loom::memory
