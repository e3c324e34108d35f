// The tasks Loom trains, by the name used in the job's `task` key, and the one place a job's
// parts are built: its layout checked against the model and the world, the process groups formed,
// the model built over them and initialised (from model.init_from when given), and the task.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/layout.h"
#include "loom/core/model.h"
#include "loom/core/task.h"
#include "loom/dist/comm.h"

namespace loom::tasks {

std::vector<std::string> task_names();

struct BuiltJob {
  core::Layout layout;
  std::shared_ptr<core::Model> model;
  std::shared_ptr<core::Task> task;
};

// Checks the job's parallel layout against its model and `world_size` processes: a one-line
// ConfigError before any work.
void validate_layout(const config::JobConfig& job, int64_t world_size);

// Builds the job's parts over `world` (null: one process); every rank calls it.
BuiltJob build_job(const config::JobConfig& job, std::shared_ptr<dist::Comm> world);

// Writes what a peer implementation needs to train the job's model on the same batches, in one
// process: the job's initial weights with their config (`dir`/model/), the training settings and the
// task's name (`dir`/job.json) and the first `steps` steps' micro-batches as the task exports them
// (`dir`/steps/step-NNNNNN.safetensors, tensors "<micro-batch>.<field>"; Task::export_step).
// ConfigError for a task that exports nothing.
// training.epochs as steps: ceil(epochs x the task's epoch_samples() / global_batch_size), so every
// training sample is seen at least `epochs` times (the stream runs on: the last step's samples past the
// last epoch are the next epoch's first). Sets training.steps (epochs becomes 0, so a checkpoint's
// job.yaml records the steps) and logs the count. ConfigError naming training.epochs for data without
// epochs. Nothing to do when training.steps is given.
void resolve_steps(config::JobConfig& job, const core::Task& task);

void export_steps(const config::JobConfig& job, const std::string& dir, int64_t steps);

}  // namespace loom::tasks
