// Carries between pipeline stages, over the pipeline group's point-to-point messages. A stage's
// output carry differs from one micro-batch to the next (sequence lengths, image counts, which
// entries it holds), so each forward message is a fixed-size header naming every entry with its
// dtype, shape and whether it needs a gradient, then one message per entry; the receiver makes them
// leaves that need a gradient where the sender's did. Backward sends each such entry's gradient
// back, whose shape the sender knows, so it posts that receive as soon as it has sent the forward
// output. Sends are started and never block a schedule: a forward send is waited once its receiver
// has certainly taken it (when its gradient comes back, or the sender recomputes it), so the output it
// holds goes with the pass; a gradient send when the next gradient is sent (its receive was posted
// when the forward was sent, so it is taken at once); the rest at the end of the step (wait_sends).
// Messages are tagged by (micro-batch, sending stage, direction, entry), so any number may be in
// flight between two ranks. Headers and gradient buffers are reused from step to step (the forward
// inputs are not: they are the stage's inputs until its backward).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/core/layer.h"
#include "loom/dist/comm.h"

namespace loom::parallel::pipeline {

class CarryExchange {
 public:
  // `global_stages`: parallel.pp x parallel.virtual_stages (bounds the tags). The carries arrive on
  // `device` (the job's); their headers travel as CPU bytes.
  CarryExchange(std::shared_ptr<dist::Comm> pipeline, int64_t global_stages, at::Device device = at::kCPU);
  ~CarryExchange();
  CarryExchange(const CarryExchange&) = delete;
  CarryExchange& operator=(const CarryExchange&) = delete;

  // Starts sending micro-batch `micro_batch`'s `carry`, the output of global stage `stage`, to `peer`.
  void send_forward(const core::Carry& carry, int64_t peer, int64_t micro_batch, int64_t stage);
  // Starts receiving the header of what `peer`'s stage `stage - 1` sends this rank's stage `stage`
  // for `micro_batch` (early: it is small), if not started yet.
  void start_receive_forward(int64_t peer, int64_t micro_batch, int64_t stage);
  // Waits for that carry (starting its receive if need be).
  core::Carry receive_forward(int64_t peer, int64_t micro_batch, int64_t stage);

  // Starts receiving the gradients of `output`'s entries that need one (in name order), sent back by
  // `peer`'s stage `stage + 1`; `output` is what send_forward sent from `stage`.
  void start_receive_backward(const core::Carry& output, int64_t peer, int64_t micro_batch, int64_t stage);
  // Waits for them: name -> gradient.
  std::map<std::string, at::Tensor> receive_backward(int64_t micro_batch, int64_t stage);
  // Takes gradients back once backward is done with them, for later receives of their shape (those
  // something else still holds are left alone); empties `gradients`.
  void give_back(std::map<std::string, at::Tensor>& gradients);
  // Starts sending the gradients of `input`'s entries that need one (zeros where backward left none)
  // to `peer`'s stage `stage - 1`; `input` is what receive_forward gave `stage`.
  void send_backward(const core::Carry& input, int64_t peer, int64_t micro_batch, int64_t stage);

  // Waits for the forward send of `micro_batch` from `stage` (once the receiver has taken or is
  // about to take it; its tensors are then let go).
  void wait_forward_send(int64_t micro_batch, int64_t stage);
  // Waits for every send started (the end of a step); the seconds it waited.
  double wait_sends();
  // Seconds spent waiting in receives since the last call (the pipeline's idle time on this rank).
  double take_receive_wait();
  // Headers and gradient buffers taken from the spares rather than allocated, so far.
  int64_t buffers_reused() const { return reused_; }

 private:
  struct Header;
  int64_t tag(int64_t micro_batch, int64_t stage, bool backward, int64_t part) const;
  at::Tensor take_buffer(at::IntArrayRef sizes, at::ScalarType dtype, at::Device device);
  void give_back(at::Tensor buffer);

  std::shared_ptr<dist::Comm> comm_;
  int64_t global_stages_;
  at::Device device_;
  // Forward sends by (micro-batch, stage); gradient sends in the order started.
  struct ForwardSend {
    at::Tensor header;
    std::vector<std::unique_ptr<dist::PendingWork>> work;
  };
  std::map<std::pair<int64_t, int64_t>, ForwardSend> forward_sends_;
  std::vector<std::unique_ptr<dist::PendingWork>> backward_sends_;
  double send_wait_s_ = 0;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Header>> headers_;  // by (micro-batch, stage)
  // Backward receives in flight, by (micro-batch, sending stage of the forward): names and buffers.
  struct GradientReceive {
    std::vector<std::string> names;
    std::vector<at::Tensor> buffers;
    std::vector<std::unique_ptr<dist::PendingWork>> work;
  };
  std::map<std::pair<int64_t, int64_t>, GradientReceive> gradients_;
  double receive_wait_s_ = 0;
  // By dtype, device and shape.
  std::map<std::tuple<int, std::string, std::vector<int64_t>>, std::vector<at::Tensor>> spare_;
  size_t spare_count_ = 0;
  int64_t reused_ = 0;
};

}  // namespace loom::parallel::pipeline
