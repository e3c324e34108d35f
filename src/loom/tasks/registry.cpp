#include "loom/tasks/registry.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>
#include <utility>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/safetensors.h"
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
  auto context_parallel =
      parallel::context_parallel_degrees(layout.cp, job.parallel.cp_ulysses, job.parallel.dynamic_cp);
  std::optional<parallel::TensorParallelGroup> vision_tp;
  if (job.parallel.vision_tp == 1) vision_tp = parallel::TensorParallelGroup{};
  auto model = models::build_model(config, options, vision_tp);
  models::init_parameters(*model, static_cast<uint64_t>(t.seed));
  if (!job.model.init_from.empty()) models::load_parameters(*model, job.model.init_from);
  model->to(layout.device);  // initialised on the CPU: the same weights on every device
  BuiltJob built;
  built.task = std::make_shared<VlmSftTask>(job, model, layout, std::move(context_parallel));
  built.model = std::move(model);
  built.layout = std::move(layout);
  return built;
}

// The Wan layouts: data parallelism, ZeRO-1 and FSDP for both; tensor parallelism for the DiT (over its
// heads and feed-forward, the residual stream whole: no sequence parallelism), and pipeline parallelism
// (its blocks cut into stages, the embeddings with the first and the head with the last). `tp_width` is what
// tp must divide besides the heads (the DiT's ffn_dim); 0: the model is whole on every rank.
void check_wan_layout(const config::JobConfig& job, const char* what, int64_t world_size, int64_t heads,
                      int64_t layers, int64_t tp_width) {
  const auto& p = job.parallel;
  const bool dit = tp_width > 0;
  if ((!dit && (p.tp != 1 || p.pp != 1 || p.cp != 1)) || p.ep != 1)
    throw ConfigError(fmt::format(
        "parallel: {} trains under data parallelism, ZeRO-1{} and FSDP only ({}ep 1{}); got tp {}, "
        "pp {}, cp {}, ep {}",
        what, dit ? ", tensor, pipeline and context parallelism" : "", dit ? "" : "pp, cp, ",
        dit ? "" : ", tp 1", p.tp, p.pp, p.cp, p.ep));
  if (p.dynamic_cp)
    throw ConfigError(
        fmt::format("parallel.dynamic_cp: {}'s samples all hold one number of tokens, so one degree fits "
                    "every step (remove it, and set parallel.cp)",
                    what));
  if (p.sequence_parallel)
    throw ConfigError(
        fmt::format("parallel.sequence_parallel: {} keeps whole sequences on every tensor-parallel "
                    "rank (remove it)",
                    what));
  if (p.vision_tp != 0)
    throw ConfigError(fmt::format("parallel.vision_tp: {} has no vision tower (remove it)", what));
  if (tp_width > 0 && tp_width % p.tp != 0)
    throw ConfigError(
        fmt::format("parallel.tp={} does not divide {}'s ffn_dim {} (each rank holds an equal "
                    "share of the feed-forward)",
                    p.tp, what, tp_width));
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

parallel::ParamOptions param_options(const config::JobConfig& job, const core::Layout& layout) {
  parallel::ParamOptions options;
  options.dtype = job.training.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  options.tp = {layout.tp, false};
  options.cp = parallel::context_parallel_group(layout.cp, job.parallel.cp_ulysses);
  return options;
}

BuiltJob build_flow_matching(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const models::WanConfig config = wan_config(job);
  check_wan_layout(job, "the Wan DiT", world ? world->size() : 1, config.num_heads, config.num_layers,
                   config.ffn_dim);
  core::Layout layout = core::make_layout(job, std::move(world));
  auto model = std::make_shared<models::WanModel>(config, param_options(job, layout));
  models::init_wan_parameters(*model, static_cast<uint64_t>(job.training.seed));
  if (!job.model.init_from.empty()) models::load_wan_parameters(*model, job.model.init_from);
  model->to(layout.device);
  BuiltJob built;
  built.task = std::make_shared<flow_matching::FlowMatchingTask>(job, model, layout);
  built.model = std::move(model);
  built.layout = std::move(layout);
  return built;
}

BuiltJob build_vae(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const models::WanVaeConfig config = wan_vae_config(job);
  check_wan_layout(job, "the Wan VAE", world ? world->size() : 1, 1, 4, 0);
  core::Layout layout = core::make_layout(job, std::move(world));
  auto model = std::make_shared<models::WanVAE>(config, param_options(job, layout));
  models::init_wan_vae_parameters(*model, static_cast<uint64_t>(job.training.seed));
  if (!job.model.init_from.empty()) models::load_parameters(*model, job.model.init_from);
  model->to(layout.device);
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
    check_wan_layout(job, "the Wan DiT", world_size, config.num_heads, config.num_layers, config.ffn_dim);
  } else if (entry.name == "vae") {
    wan_vae_config(job);
    check_wan_layout(job, "the Wan VAE", world_size, 1, 4, 0);
  } else {
    models::validate_layout(job, models::job_model_config(job), world_size);
  }
}

BuiltJob build_job(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  const TaskEntry& entry = task_entry(job);
  nn::set_fused_kernels(job.features.fused_kernels);
  return entry.build(job, std::move(world));
}

void export_steps(const config::JobConfig& job, const std::string& dir, int64_t steps) {
  if (steps < 1) throw ConfigError(fmt::format("data export: needs --steps >= 1, got {}", steps));
  const auto built = build_job(job, nullptr);
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
