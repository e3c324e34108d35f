// The task's training steps as the trainer takes them: built ahead by the loader's threads (pinned on
// a GPU job), and each step's device inputs sent to the device while the step before computes.
#pragma once
#include <cstdint>
#include <optional>

#include "loom/config/config.h"
#include "loom/core/device.h"
#include "loom/core/task.h"
#include "loom/data/loader.h"

namespace loom::train {

class StepFeed {
 public:
  // Steps [first, end) of `task` on `device`, with data.num_workers threads building up to
  // data.prefetch steps ahead.
  StepFeed(const core::Task& task, const config::DataSection& data, const at::Device& device, int64_t first,
           int64_t end);

  // The next step, its device inputs on their way (the compute stream waits for them); on a GPU the
  // step after it is taken from the loader now and its copies started (on the CPU nothing is taken
  // ahead: there is no copy to overlap).
  core::StepData next();
  // The time next() has waited for the loader.
  double wait_seconds() const { return loader_.wait_seconds(); }

 private:
  core::StepData started(core::StepData step);

  data::PrefetchLoader<core::StepData> loader_;
  core::InputStager stager_;
  bool ahead_of_use_;
  std::optional<core::StepData> ahead_;
  int64_t next_ = 0, end_ = 0;  // the index of the step next() returns, and the end
};

}  // namespace loom::train
