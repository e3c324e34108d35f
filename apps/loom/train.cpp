// loom train, eval and bench: a job's Trainer, over the ranks a launcher started.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/config/config.h"
#include "loom/core/device.h"
#include "loom/dist/comm.h"
#include "loom/dist/launch_env.h"
#include "loom/memory/counting_allocator.h"
#include "loom/tasks/registry.h"
#include "loom/train/trainer.h"
#include "loom/util/log.h"
#include "startup.h"

namespace loom::cli {

namespace {

struct JobArguments {
  std::string config_path;
  std::vector<std::string> overrides;
};

// Loads the job and gives `work` its Trainer and whether this process is rank 0. Started by loom
// run, torchrun, Slurm or Open MPI, the process first joins the other ranks, after checking that the
// job's parallel layout fits their number.
int with_trainer(const JobArguments& arguments, const std::function<void(train::Trainer&, bool)>& work) {
  auto job = config::load_config(arguments.config_path, arguments.overrides);
  configure_logging(job.tools.log_level);
  const dist::LaunchEnv launch = dist::launch_env_from_process();
  use_threads(job.training.threads, launch.local_world_size);
  const at::Device device = core::select_device(job.training, launch.local_rank);
  std::shared_ptr<dist::Comm> comm;
  if (launch.world_size > 1) {
    tasks::validate_layout(job, launch.world_size);
    comm = dist::Comm::connect(launch, std::chrono::seconds(job.parallel.timeout_s),
                               std::chrono::seconds(job.parallel.heartbeat_timeout_s), device);
    if (launch.rank != 0) configure_logging("warn");  // rank 0 reports; the others only warn
  }
  train::Trainer trainer(job, comm);
  work(trainer, launch.rank == 0);
  return 0;
}

// loom bench's report: rates, step time, MFU, memory, and the time split as seconds and shares.
nlohmann::json bench_json(const train::BenchResult& r) {
  auto share = [&r](double seconds) { return r.total_s > 0 ? seconds / r.total_s : 0.0; };
  nlohmann::json split;
  for (const auto& [name, seconds] : {std::pair<const char*, double>{"data", r.data_s},
                                      {"forward", r.forward_s},
                                      {"backward", r.backward_s},
                                      {"optimizer", r.optimizer_s},
                                      {"communication", r.communication_s}})
    split[name] = {{"s", seconds}, {"share", share(seconds)}};
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; };
  const nlohmann::json memory = {
      {"parameters_mib", mib(r.parameter_bytes)},          {"gradients_mib", mib(r.gradient_bytes)},
      {"optimizer_mib", mib(r.optimizer_bytes)},           {"activations_mib", mib(r.activation_bytes)},
      {"peak_allocated_mib", mib(r.peak_allocated_bytes)}, {"peak_rss_mib", r.peak_rss_mib}};
  nlohmann::json out = {{"steps", r.steps},
                        {"warmup", r.warmup},
                        {"data_parallel_ranks", r.ranks},
                        {"tokens_per_s", r.tokens_per_s},
                        {"samples_per_s", r.samples_per_s},
                        {"step_time_median_s", r.step_time_median_s},
                        {"mfu", r.mfu},
                        {"sgemm_gflops", r.sgemm_gflops},
                        {"peak_rss_mib", r.peak_rss_mib},
                        {"memory", memory},
                        {"time_s", r.total_s},
                        {"time_split", split}};
  out["device"] = r.device;
  if (r.device != "cpu")
    out["device_memory"] = {{"peak_allocated_mib", mib(r.device_peak_allocated_bytes)},
                            {"peak_reserved_mib", mib(r.device_peak_reserved_bytes)}};
  if (!r.pipeline.empty()) {
    // Each pipeline rank's idle share of its step time beside the schedule's bubble: (p - 1) / (v m + p - 1)
    // of a step for p ranks, v chunks each and m micro-batches, when every stage takes as long.
    const auto p = static_cast<double>(r.pipeline.size()), v = static_cast<double>(r.virtual_stages),
               m = static_cast<double>(r.micro_batches);
    nlohmann::json ranks = nlohmann::json::array();
    double idle = 0, total = 0;
    for (size_t i = 0; i < r.pipeline.size(); ++i) {
      const auto& stage = r.pipeline[i];
      const double seconds = stage.busy_s + stage.idle_s;
      ranks.push_back({{"rank", i},
                       {"busy_s", stage.busy_s},
                       {"idle_s", stage.idle_s},
                       {"idle_share", seconds > 0 ? stage.idle_s / seconds : 0.0},
                       {"activations_mib", mib(stage.activation_bytes)}});
      idle += stage.idle_s;
      total += seconds;
    }
    out["pipeline"] = {{"ranks", r.pipeline.size()},
                       {"virtual_stages", r.virtual_stages},
                       {"micro_batches", r.micro_batches},
                       {"bubble_theoretical", (p - 1) / (v * m + p - 1)},
                       {"bubble_measured", total > 0 ? idle / total : 0.0},
                       {"per_rank", ranks}};
  }
  if (!r.context.empty()) {
    // The ring's hidden share: the part of the time its messages take alone that the ranks did not
    // spend blocked on them after their compute.
    nlohmann::json ranks = nlohmann::json::array();
    double wait = 0, alone = 0;
    for (size_t i = 0; i < r.context.size(); ++i) {
      const auto& c = r.context[i];
      ranks.push_back({{"rank", i},
                       {"activations_mib", mib(c.activation_bytes)},
                       {"ring_compute_s", c.ring_compute_s},
                       {"ring_wait_s", c.ring_wait_s},
                       {"ring_alone_s", c.ring_alone_s},
                       {"ring_sent_mib", mib(c.ring_bytes)}});
      wait += c.ring_wait_s;
      alone += c.ring_alone_s;
    }
    out["context"] = {{"ranks", r.context.size()},
                      {"ulysses", r.cp_ulysses},
                      {"ring", static_cast<int64_t>(r.context.size()) / r.cp_ulysses},
                      {"ring_hidden_share", alone > 0 ? std::clamp(1.0 - wait / alone, 0.0, 1.0) : 0.0},
                      {"per_rank", ranks}};
  }
  if (!r.experts.empty()) {
    // The exchanges' hidden share (as the ring's), the grouped products' rate, the rows each ep rank
    // computed, and the picks each expert got.
    nlohmann::json ranks = nlohmann::json::array();
    double wait = 0, alone = 0, flops = 0, compute = 0;
    for (size_t i = 0; i < r.experts.size(); ++i) {
      const auto& e = r.experts[i];
      ranks.push_back({{"rank", i},
                       {"rows", e.rows},
                       {"grouped_mm_s", e.compute_s},
                       {"grouped_mm_gflops", e.compute_s > 0 ? e.flops / e.compute_s / 1e9 : 0.0},
                       {"exchange_mib", mib(e.bytes)},
                       {"exchange_wait_s", e.wait_s},
                       {"exchange_alone_s", e.alone_s}});
      wait += e.wait_s;
      alone += e.alone_s;
      flops += e.flops;
      compute += e.compute_s;
    }
    out["experts"] = {{"ep", r.experts.size()},
                      {"exchange_hidden_share", alone > 0 ? std::clamp(1.0 - wait / alone, 0.0, 1.0) : 0.0},
                      {"grouped_mm_gflops", compute > 0 ? flops / compute / 1e9 : 0.0},
                      {"expert_tokens", r.expert_tokens},
                      {"per_rank", ranks}};
  }
  return out;
}

}  // namespace

Command add_train(CLI::App& loom) {
  auto job = std::make_shared<JobArguments>();
  auto check = std::make_shared<bool>(false);
  auto* command = loom.add_subcommand("train", "Train a model from a job config (YAML)");
  command->add_option("config", job->config_path, kConfigHelp)->required();
  command->add_option("--set", job->overrides, kOverrideHelp);
  command->add_flag("--check", *check,
                    "Only check the job: load the config, data, tokenizer, model, init_from weights, "
                    "parallel layout and the checkpoint it would resume from as training would, then "
                    "exit; nothing is written");
  return {command, [job, check] {
            return with_trainer(*job, [&](train::Trainer& trainer, bool main_rank) {
              if (*check) {
                const auto resume = trainer.check();
                if (main_rank)
                  fmt::print("{}: the job checks out ({}); nothing was trained\n", job->config_path,
                             resume ? "it would resume from " + *resume : "it would start at step 0");
                return;
              }
              if (auto result = trainer.train(); result && main_rank) fmt::print("{}", result->report);
            });
          }};
}

Command add_eval(CLI::App& loom) {
  struct Arguments {
    JobArguments job;
    std::string checkpoint_dir, predictions_path;
  };
  auto arguments = std::make_shared<Arguments>();
  auto* command = loom.add_subcommand("eval", "Evaluate a checkpoint on the job's held-out data");
  command->add_option("config", arguments->job.config_path, kConfigHelp)->required();
  command
      ->add_option("--checkpoint", arguments->checkpoint_dir,
                   "Checkpoint or model directory, or a run directory (its newest checkpoint)")
      ->required();
  command->add_option("--set", arguments->job.overrides, kOverrideHelp);
  command->add_option("--predictions", arguments->predictions_path,
                      "Write each question, its answer and the model's answer as JSON lines to this file");
  return {command, [arguments] {
            return with_trainer(arguments->job, [&arguments](train::Trainer& trainer, bool main_rank) {
              trainer.load_weights(checkpoint::resolve_model_directory(arguments->checkpoint_dir));
              const auto result = trainer.evaluate();
              if (!main_rank) return;
              fmt::print("{}", result.report);
              if (!arguments->predictions_path.empty())
                train::write_records(result, arguments->predictions_path);
            });
          }};
}

Command add_bench(CLI::App& loom) {
  struct Arguments {
    JobArguments job;
    int64_t steps = 20, warmup = 3;
    std::string profile;
  };
  auto arguments = std::make_shared<Arguments>();
  auto* command = loom.add_subcommand(
      "bench", "Time a job's training steps after warm-up and print one JSON object (nothing is written)");
  command->add_option("config", arguments->job.config_path, kConfigHelp)->required();
  command->add_option("--set", arguments->job.overrides, kOverrideHelp);
  command->add_option("--steps", arguments->steps, "Timed steps (default 20)");
  command->add_option("--warmup", arguments->warmup, "Untimed steps first (default 3)");
  command->add_option("--profile", arguments->profile,
                      "Write a Chrome trace of the timed steps here (rank 0's): every operator's time, and "
                      "on a GPU its kernels");
  return {command, [arguments] {
            // Every tensor this thread allocates from here on is counted, the model's included.
            memory::CountingAllocator::install();
            const memory::CountingAllocator::Scope counted;
            return with_trainer(arguments->job, [&arguments](train::Trainer& trainer, bool main_rank) {
              const train::BenchResult r =
                  trainer.bench(arguments->warmup, arguments->steps, main_rank ? arguments->profile : "");
              if (main_rank) fmt::print("{}\n", bench_json(r).dump());
            });
          }};
}

}  // namespace loom::cli
