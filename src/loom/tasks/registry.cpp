#include "loom/tasks/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "loom/models/registry.h"
#include "loom/models/wan/dit.h"
#include "loom/models/wan/names.h"
#include "loom/models/wan/vae.h"
#include "loom/models/weights.h"
#include "loom/nn/fused.h"
#include "loom/tasks/flow_matching/task.h"
#include "loom/tasks/vae/task.h"
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

// The Wan families hold whole layers on every rank for now: data parallelism, ZeRO-1 and FSDP only.
void check_wan_layout(const config::JobConfig& job, const char* what, int64_t world_size, int64_t heads,
                      int64_t layers) {
  const auto& p = job.parallel;
  if (p.tp != 1 || p.pp != 1 || p.cp != 1 || p.ep != 1 || p.sequence_parallel)
    throw ConfigError(
        fmt::format("parallel: {} trains under data parallelism, ZeRO-1 and FSDP only (tp, pp, cp, "
                    "ep 1, no sequence_parallel); got tp {}, pp {}, cp {}, ep {}",
                    what, p.tp, p.pp, p.cp, p.ep));
  config::validate_parallel(job, {heads, heads, heads, heads, layers}, world_size);
}

models::WanConfig wan_config(const config::JobConfig& job) {
  const models::NamedConfig named = models::job_hf_config(job);
  return models::parse_wan_config(named.hf, named.source);
}

models::WanVaeConfig wan_vae_config(const config::JobConfig& job) {
  const models::NamedConfig named = models::job_hf_config(job);
  return models::parse_wan_vae_config(named.hf, named.source);
}

parallel::ParamOptions param_options(const config::JobConfig& job) {
  parallel::ParamOptions options;
  options.dtype = job.training.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  return options;
}

BuiltJob build_flow_matching(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const models::WanConfig config = wan_config(job);
  check_wan_layout(job, "the Wan DiT", world ? world->size() : 1, config.num_heads, config.num_layers);
  core::Layout layout = core::make_layout(job, std::move(world));
  auto model = std::make_shared<models::WanModel>(config, param_options(job));
  models::init_wan_parameters(*model, static_cast<uint64_t>(job.training.seed));
  if (!job.model.init_from.empty()) models::load_wan_parameters(*model, job.model.init_from);
  BuiltJob built;
  built.task = std::make_shared<flow_matching::FlowMatchingTask>(job, model, layout);
  built.model = std::move(model);
  built.layout = std::move(layout);
  return built;
}

BuiltJob build_vae(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const models::WanVaeConfig config = wan_vae_config(job);
  check_wan_layout(job, "the Wan VAE", world ? world->size() : 1, 1, 4);
  core::Layout layout = core::make_layout(job, std::move(world));
  auto model = std::make_shared<models::WanVAE>(config, param_options(job));
  models::init_wan_vae_parameters(*model, static_cast<uint64_t>(job.training.seed));
  if (!job.model.init_from.empty()) models::load_parameters(*model, job.model.init_from);
  BuiltJob built;
  built.task = std::make_shared<VaeTask>(job, model, layout);
  built.model = std::move(model);
  built.layout = std::move(layout);
  return built;
}

// Each task with the model families it trains.
struct TaskEntry {
  std::string name;
  std::vector<std::string> families;
  TaskBuilder build;
};

const std::vector<TaskEntry>& builders() {
  static const std::vector<TaskEntry> table = {{"vlm_sft", {"qwen2_vl", "qwen2_5_vl"}, build_vlm_sft},
                                               {"flow_matching", {"wan"}, build_flow_matching},
                                               {"vae", {"wan_vae"}, build_vae}};
  return table;
}

const TaskEntry& task_entry(const config::JobConfig& job) {
  const auto entry = std::find_if(builders().begin(), builders().end(),
                                  [&job](const TaskEntry& e) { return e.name == job.training.task; });
  if (entry == builders().end())
    throw ConfigError(fmt::format("training.task: '{}' is not a task Loom trains (valid: {})",
                                  job.training.task, fmt::join(task_names(), ", ")));
  if (std::find(entry->families.begin(), entry->families.end(), job.model.family) == entry->families.end())
    throw ConfigError(fmt::format("training.task: {} trains model.family {}, not {}", entry->name,
                                  fmt::join(entry->families, " or "), job.model.family));
  return *entry;
}

}  // namespace

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const auto& entry : builders()) names.push_back(entry.name);
  return names;
}

void validate_layout(const config::JobConfig& job, int64_t world_size) {
  const TaskEntry& entry = task_entry(job);
  if (entry.name == "flow_matching") {
    const models::WanConfig config = wan_config(job);
    check_wan_layout(job, "the Wan DiT", world_size, config.num_heads, config.num_layers);
  } else if (entry.name == "vae") {
    wan_vae_config(job);
    check_wan_layout(job, "the Wan VAE", world_size, 1, 4);
  } else {
    models::validate_layout(job, models::job_model_config(job), world_size);
  }
}

BuiltJob build_job(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const TaskEntry& entry = task_entry(job);
  nn::set_fused_kernels(job.features.fused_kernels);
  return entry.build(job, std::move(world));
}

}  // namespace loom::tasks
