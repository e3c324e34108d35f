// Schedules: how a step's micro-batches go through forward and backward. Each is a plain function
// over the task's forward step, so a schedule can be read, tested and swapped alone (pipeline
// schedules sit beside this one).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/task.h"
#include "loom/dist/comm.h"
#include "loom/train/plan.h"

namespace loom::train {

// The task's forward of one micro-batch through one stage (core::Task::forward).
using ForwardStep =
    std::function<core::ForwardResult(const core::MicroBatch&, const core::Stage&, core::Carry)>;

// What a schedule ran, summed over this rank's micro-batches.
struct ScheduleResult {
  double loss_sum = 0;  // unscaled
  int64_t tokens = 0, samples = 0;
  double flops = 0;
  double forward_s = 0, backward_s = 0;
  double sync_s = 0;  // waited in the passes' communication (FSDP)
  // Under a counting allocator (loom bench): the most bytes one micro-batch's forward left allocated
  // for its backward (saved activations and the loss), 0 without one; under pipeline parallelism the
  // most the step's forwards held at once (every micro-batch in flight on this rank).
  int64_t activation_bytes = 0;
  double receive_wait_s = 0;  // pipeline: waited for the stages before and after (the bubble)
  std::vector<double>
      expert_tokens;  // the micro-batches' ForwardResult::expert_tokens added up (empty: none)
  void add_expert_tokens(const at::Tensor& tokens);
};

// One stage holding every layer: each micro-batch in turn, forward then backward of its loss sum
// times `scale` (one over the step's global count), in `passes` passes: those beyond the
// micro-batches are empty (a rank with fewer micro-batches than another still takes part in each
// pass's collectives).
ScheduleResult forward_backward_no_pipelining(const ForwardStep& forward_step,
                                              const std::vector<core::Stage>& stages,
                                              const std::vector<std::shared_ptr<core::MicroBatch>>& batches,
                                              size_t passes, double scale, GradientSync& sync);

// This rank's chunks of a pipeline (`stages`, one per virtual stage, in chunk order) over the step's
// micro-batches, in the order the schedule gives (parallel/pipeline/order.h): each forward's input
// received from the stage before and its output sent on; the last stage's loss sums times `scale`
// started backward, every other stage's backward driven by the gradients of its output received from
// the stage after, and its input's gradients sent back. Every rank of the pipeline holds the same
// micro-batches; the loss, tokens, samples and FLOPs are counted on the last stage.
ScheduleResult forward_backward_pipelined(const ForwardStep& forward_step,
                                          const std::vector<core::Stage>& stages,
                                          const std::vector<std::shared_ptr<core::MicroBatch>>& batches,
                                          const dist::Comm& group, const PipelineRun& pipeline, double scale,
                                          GradientSync& sync);

// The step's micro-batches through the plan's stages by the schedule its layout runs: the pipeline's
// under pipeline parallelism, otherwise `passes` passes without one (GradientSync::passes_and_total).
ScheduleResult forward_backward(const ForwardStep& forward_step, const AppliedPlan& plan,
                                const std::vector<std::shared_ptr<core::MicroBatch>>& batches, size_t passes,
                                double scale);

}  // namespace loom::train
