#include "loom/tasks/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/nn/fused.h"
#include "loom/tasks/vlm_sft/task.h"
#include "loom/util/errors.h"

namespace loom::tasks {

namespace {

// Checks the job's layout against its model, forms the groups over `world`, and builds the model and
// the task over them.
using TaskBuilder = std::function<BuiltJob(const config::JobConfig&, std::shared_ptr<dist::Comm> world)>;

BuiltJob build_vlm_sft(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const auto& t = job.training;
  const models::Qwen2VLConfig config = models::job_model_config(job);
  models::validate_layout(job, config, world ? world->size() : 1);
  core::Layout layout = core::make_layout(job, std::move(world));
  parallel::ParamOptions options;
  options.dtype = t.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  options.tp = {layout.tp, job.parallel.sequence_parallel};
  std::optional<parallel::TensorParallelGroup> vision_tp;
  if (job.parallel.vision_tp == 1) vision_tp = parallel::TensorParallelGroup{};
  auto model = models::build_model(config, options, vision_tp);
  models::init_parameters(*model, static_cast<uint64_t>(t.seed));
  if (!job.model.init_from.empty()) models::load_parameters(*model, job.model.init_from);
  BuiltJob built;
  built.task = std::make_shared<VlmSftTask>(job, model, layout);
  built.model = std::move(model);
  built.layout = std::move(layout);
  return built;
}

const std::vector<std::pair<std::string, TaskBuilder>>& builders() {
  static const std::vector<std::pair<std::string, TaskBuilder>> table = {{"vlm_sft", build_vlm_sft}};
  return table;
}

}  // namespace

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const auto& [name, builder] : builders()) names.push_back(name);
  return names;
}

void validate_layout(const config::JobConfig& job, int64_t world_size) {
  models::validate_layout(job, models::job_model_config(job), world_size);
}

BuiltJob build_job(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const auto builder = std::find_if(builders().begin(), builders().end(),
                                    [&job](const auto& entry) { return entry.first == job.training.task; });
  if (builder == builders().end())
    throw ConfigError(fmt::format("training.task: '{}' is not a task Loom trains (valid: {})",
                                  job.training.task, fmt::join(task_names(), ", ")));
  nn::set_fused_kernels(job.features.fused_kernels);
  return builder->second(job, std::move(world));
}

}  // namespace loom::tasks
