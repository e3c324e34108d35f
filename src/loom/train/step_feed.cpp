#include "loom/train/step_feed.h"

#include <utility>

namespace loom::train {

StepFeed::StepFeed(const core::Task& task, const config::DataSection& data, const at::Device& device,
                   int64_t first, int64_t end)
    : loader_(
          [&task, pin = device.is_cuda()](int64_t step) {
            core::StepData out = task.step_data(step);
            if (pin) core::pin_inputs(out);
            return out;
          },
          first, static_cast<int>(data.num_workers), static_cast<int>(data.prefetch)),
      stager_(device),
      ahead_of_use_(device.is_cuda()),
      next_(first),
      end_(end) {}

core::StepData StepFeed::started(core::StepData step) {
  stager_.start(step);
  return step;
}

core::StepData StepFeed::next() {
  core::StepData step = ahead_ ? std::move(*ahead_) : started(loader_.next());
  ahead_.reset();
  stager_.ready();
  if (++next_ < end_ && ahead_of_use_) ahead_ = started(loader_.next());
  return step;
}

}  // namespace loom::train
