#include "loom/tasks/registry.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/models/converters.h"
#include "loom/models/generator.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/nn/fused.h"
#include "loom/tasks/flow_matching/task.h"
#include "loom/tasks/vae/task.h"
#include "loom/tasks/vlm_sft/task.h"
#include "loom/util/errors.h"

namespace loom::tasks {

namespace {

// The context-parallel groups of each degree a job may shard a step over (parallel/context/shard.h).
using ContextDegrees = std::map<int64_t, parallel::ContextParallelGroup>;

// The model a family of the task's kind built, as that kind's interface.
template <typename Kind>
std::shared_ptr<Kind> as_kind(std::shared_ptr<core::Model> model, const config::JobConfig& job) {
  return models::as_interface<Kind>(std::move(model), "model.family: " + job.model.family);
}

// The task over a model built for the job: the rank's groups in `layout` and `cp`.
using TaskBuilder =
    std::function<std::shared_ptr<core::Task>(const config::JobConfig&, std::shared_ptr<core::Model> model,
                                              const core::Layout& layout, ContextDegrees cp)>;

std::shared_ptr<core::Task> vlm_sft_task(const config::JobConfig& job, std::shared_ptr<core::Model> model,
                                         const core::Layout& layout, ContextDegrees cp) {
  auto processor = models::make_processor(job.model.family, model->hf_config(), job.source);
  return std::make_shared<VlmSftTask>(job, as_kind<models::VisionLanguageModel>(std::move(model), job),
                                      layout, std::move(cp), std::move(processor));
}

std::shared_ptr<core::Task> flow_matching_task(const config::JobConfig& job,
                                               std::shared_ptr<core::Model> model, const core::Layout& layout,
                                               ContextDegrees /*cp: the model's*/) {
  return std::make_shared<flow_matching::FlowMatchingTask>(
      job, as_kind<models::Denoiser>(std::move(model), job), layout);
}

std::shared_ptr<core::Task> vae_task(const config::JobConfig& job, std::shared_ptr<core::Model> model,
                                     const core::Layout& layout, ContextDegrees /*cp: 1*/) {
  return std::make_shared<VaeTask>(job, as_kind<models::LatentCodec>(std::move(model), job), layout);
}

// Each task with the kind of model it trains.
struct TaskEntry {
  std::string name;
  models::ModelKind kind;
  TaskBuilder build;
};

const std::vector<TaskEntry>& builders() {
  static const std::vector<TaskEntry> table = {
      {"vlm_sft", models::ModelKind::vision_language, vlm_sft_task},
      {"flow_matching", models::ModelKind::denoiser, flow_matching_task},
      {"vae", models::ModelKind::latent_codec, vae_task}};
  return table;
}

const TaskEntry& task_entry(const config::JobConfig& job) {
  const auto entry = std::find_if(builders().begin(), builders().end(),
                                  [&job](const TaskEntry& e) { return e.name == job.training.task; });
  if (entry == builders().end())
    throw ConfigError(fmt::format("training.task: '{}' is not a task Loom trains (valid: {})",
                                  job.training.task, fmt::join(task_names(), ", ")));
  if (models::family_named(job.model.family).kind != entry->kind)
    throw ConfigError(fmt::format("training.task: {} trains model.family {}, not {}", entry->name,
                                  fmt::join(models::family_names(entry->kind), " or "), job.model.family));
  return *entry;
}

}  // namespace

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const auto& entry : builders()) names.push_back(entry.name);
  return names;
}

void validate_layout(const config::JobConfig& job, int64_t world_size) {
  task_entry(job);
  models::check_job_layout(job, world_size);
}

BuiltJob build_job(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const TaskEntry& entry = task_entry(job);
  nn::set_fused_kernels(job.features.fused_kernels);
  const models::NamedConfig named = models::check_job_layout(job, world ? world->size() : 1);
  BuiltJob built;
  built.layout = core::make_layout(job, std::move(world));
  // The context-parallel subgroups are formed once (each formation is a collective over the store):
  // the job's degree for the model, and with parallel.dynamic_cp every divisor of it for the task.
  ContextDegrees cp =
      parallel::context_parallel_degrees(built.layout.cp(), job.parallel.cp_ulysses, job.parallel.dynamic_cp);
  built.model = models::build_job_model(job, named, built.layout, cp.at(built.layout.context_parallel()));
  models::convert_model(*built.model, job);
  built.task = entry.build(job, built.model, built.layout, std::move(cp));
  return built;
}

namespace {

// The samples `epochs` passes take (epochs x epoch_samples, a fraction's rounding error of 1e-9 ignored),
// in whole steps.
int64_t steps_for_epochs(double epochs, int64_t epoch_samples, int64_t global_batch_size) {
  const auto samples = static_cast<int64_t>(std::ceil(epochs * static_cast<double>(epoch_samples) - 1e-9));
  return (samples + global_batch_size - 1) / global_batch_size;
}

}  // namespace

void resolve_steps(config::JobConfig& job, const core::Task& task) {
  auto& t = job.training;
  if (t.epochs == 0) return;
  const int64_t samples = task.epoch_samples();
  if (samples == 0)
    throw ConfigError(fmt::format(
        "training.epochs: dataset {} is generated, without epochs; give training.steps", job.data.dataset));
  t.steps = std::max<int64_t>(1, steps_for_epochs(t.epochs, samples, t.global_batch_size));
  spdlog::info("training.epochs {}: {} samples an epoch, global batch {}: {} steps ({} samples)", t.epochs,
               samples, t.global_batch_size, t.steps, t.steps * t.global_batch_size);
  t.epochs = 0;
}

void export_steps(const config::JobConfig& given, const std::string& dir, int64_t steps) {
  if (steps < 1) throw ConfigError(fmt::format("data export: needs --steps >= 1, got {}", steps));
  config::JobConfig job = given;
  const auto built = build_job(job, nullptr);
  resolve_steps(job, *built.task);
  const auto& t = job.training;
  const std::vector<std::pair<std::string, at::Tensor>> first = built.task->export_step(0);
  if (first.empty())
    throw ConfigError(
        fmt::format("data export: task {} has no peer implementation to export batches for "
                    "(vlm_sft and flow_matching have)",
                    t.task));
  std::filesystem::create_directories(dir + "/model");
  std::filesystem::create_directories(dir + "/steps");
  auto& model = built.model->module();
  checkpoint::save_safetensors(dir + "/model/model.safetensors", models::named_parameters(model),
                               {{"format", "pt"}});
  checkpoint::write_text_file_durable(dir + "/model/config.json", built.model->hf_config().dump(2) + "\n");
  const nlohmann::json settings = {{"task", t.task},
                                   {"steps", t.steps},
                                   {"exported_steps", steps},
                                   {"global_batch_size", t.global_batch_size},
                                   {"micro_batch_size", t.micro_batch_size},
                                   {"lr", t.lr},
                                   {"min_lr", t.min_lr},
                                   {"warmup_steps", t.warmup_steps},
                                   {"weight_decay", t.weight_decay},
                                   {"adam_beta1", t.adam_beta1},
                                   {"adam_beta2", t.adam_beta2},
                                   {"adam_eps", t.adam_eps},
                                   {"clip_grad", t.clip_grad},
                                   {"precision", t.precision},
                                   {"packing", job.data.packing},
                                   {"threads", at::get_num_threads()}};
  checkpoint::write_text_file_durable(dir + "/job.json", settings.dump(2) + "\n");
  for (int64_t step = 0; step < steps; ++step)
    checkpoint::save_safetensors(fmt::format("{}/steps/step-{:06d}.safetensors", dir, step + 1),
                                 step == 0 ? first : built.task->export_step(step));
  spdlog::info("exported the initial weights and {} steps of {} samples to {}", steps, t.global_batch_size,
               dir);
}

}  // namespace loom::tasks
