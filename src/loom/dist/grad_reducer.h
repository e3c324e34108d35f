// Data-parallel gradient summation in flat buckets, overlapped with the backward pass.
//
// Parameters are grouped, in reverse order (the order backward finishes their gradients), into
// buckets of up to `bucket_bytes`. With overlap, a post-hook on each parameter's gradient
// accumulator counts the gradients that are final during the armed backward pass (a step's last
// micro-batch); when a bucket is complete, and every bucket before it has started, its all-reduce
// starts while backward goes on. finish() starts what is left (parameters without a gradient on
// this rank contribute zeros), waits, and writes the sums back into the gradients; a parameter no
// rank gave a gradient to is left without one, as in one process. Buckets start in the same order
// on every rank, whichever order their gradients complete in.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "loom/dist/comm.h"

namespace torch::autograd {
struct Node;
}

namespace loom::dist {

class GradReducer {
 public:
  GradReducer(std::shared_ptr<Comm> comm, std::vector<at::Tensor> params, int64_t bucket_bytes, bool overlap);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Call just before the backward pass that completes the step's gradients (the last
  // micro-batch). Without overlap it does nothing.
  void arm();
  // Sums every gradient over the ranks. Returns the seconds spent here: the communication that
  // backward did not hide.
  double finish();

  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  // Buckets whose all-reduce started during the last armed backward pass.
  int64_t started_in_backward() const { return started_in_backward_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    at::ScalarType wire = at::kFloat;
    int64_t numel = 0;
    int64_t waiting = 0;  // gradients not yet final in the armed pass
    at::Tensor flat;
    std::unique_ptr<PendingWork> work;
  };
  void on_gradient_ready(size_t param);
  void start_ready_buckets();  // in order, while the next bucket is complete
  void start(Bucket& bucket);
  void reset();

  std::shared_ptr<Comm> comm_;
  std::vector<at::Tensor> params_;
  std::vector<size_t> bucket_of_;
  std::vector<bool> ready_;
  std::vector<bool> has_grad_;  // this rank's backward gave the parameter a gradient
  std::vector<Bucket> buckets_;
  size_t next_ = 0;  // the next bucket to start
  bool overlap_ = false, armed_ = false;
  int64_t started_in_backward_ = 0;
  std::mutex mutex_;
  // The gradient accumulators carrying the hooks, kept alive so every backward reuses them.
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
};

}  // namespace loom::dist
