#include "loom/tasks/registry.h"

#include <fmt/format.h>

#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/nn/fused.h"
#include "loom/tasks/vlm_sft/task.h"

namespace loom::tasks {

std::vector<std::string> task_names() { return {"vlm_sft"}; }

void validate_layout(const config::JobConfig& job, int64_t world_size) {
  models::validate_layout(job, models::job_model_config(job), world_size);
}

BuiltJob build_job(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const auto& t = job.training;
  const models::Qwen2VLConfig config = models::job_model_config(job);
  models::validate_layout(job, config, world ? world->size() : 1);
  nn::set_fused_kernels(job.features.fused_kernels);
  BuiltJob built;
  built.layout = core::make_layout(job, std::move(world));

  parallel::ParamOptions options;
  options.dtype = t.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  options.tp = {built.layout.tp, job.parallel.sequence_parallel};
  std::optional<parallel::TensorParallelGroup> vision_tp;
  if (job.parallel.vision_tp == 1) vision_tp = parallel::TensorParallelGroup{};
  auto model = models::build_model(config, options, vision_tp);
  models::init_parameters(*model, static_cast<uint64_t>(t.seed));
  if (!job.model.init_from.empty()) models::load_parameters(*model, job.model.init_from);
  built.task = std::make_shared<VlmSftTask>(job, model, built.layout);
  built.model = std::move(model);
  return built;
}

}  // namespace loom::tasks
