#include "loom/train/forward_backward.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "loom/memory/counting_allocator.h"
#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::train {

ScheduleResult forward_backward_no_pipelining(
    const ForwardStep& forward_step, const std::vector<core::Stage>& stages,
    const std::vector<std::shared_ptr<const core::MicroBatch>>& batches, size_t passes, double scale,
    GradientSync& sync) {
  if (stages.size() != 1 || !stages.front().first || !stages.front().last)
    throw ModelError(fmt::format("forward_backward_no_pipelining runs one stage holding every layer, not {}",
                                 stages.size()));
  const core::Stage& stage = stages.front();
  const memory::CountingAllocator* counter = memory::CountingAllocator::installed();
  ScheduleResult r;
  for (size_t m = 0; m < passes; ++m) {
    sync.begin_pass();
    if (m >= batches.size()) {  // this rank's share had fewer micro-batches
      r.sync_s += sync.end_pass();
      continue;
    }
    const auto forward_begin = Clock::now();
    const int64_t allocated_before = counter ? counter->live_bytes() : 0;
    const core::ForwardResult out = forward_step(*batches[m], stage, {});
    if (counter) r.activation_bytes = std::max(r.activation_bytes, counter->live_bytes() - allocated_before);
    r.forward_s += seconds_since(forward_begin);
    sync.before_backward(m + 1 == batches.size());
    const auto backward_begin = Clock::now();
    (out.loss_sum * scale).backward();
    r.backward_s += seconds_since(backward_begin);
    r.loss_sum += out.loss_sum.item<double>();
    r.tokens += out.tokens;
    r.samples += out.samples;
    r.flops += out.flops;
    r.sync_s += sync.end_pass();
  }
  return r;
}

}  // namespace loom::train
