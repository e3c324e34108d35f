// The trainer assumes no model family, task or parallel mode: a test-only MLP and regression task
// (toy_task.h) train through the same Trainer as Qwen2-VL, in one process and, as two ranks of
// `loom run -n 2` (tests/e2e/generic_trainer.sh), under data parallelism, ZeRO-1 and FSDP with the
// one-process run's losses to 1e-6 (absolute; the
// summation order over ranks differs, so the last bits do).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/checkpoint/run_lock.h"
#include "loom/dist/launch_env.h"
#include "loom/models/weights.h"
#include "loom/train/trainer.h"
#include "loom/util/errors.h"
#include "toy_task.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

config::JobConfig toy_job(const std::string& output_dir, int64_t zero) {
  config::JobConfig job;
  job.source = "toy job";
  job.data.num_workers = 0;
  job.parallel.zero = zero;
  auto& t = job.training;
  t.steps = 30;
  t.global_batch_size = 16;
  t.micro_batch_size = 4;
  t.lr = 1e-2;
  t.warmup_steps = 3;
  t.weight_decay = 0.01;
  t.threads = 1;
  t.peak_tflops = 1;  // MFU against a stated peak: no sgemm measurement
  t.output_dir = output_dir;
  t.resume = "none";
  job.tools.progress_bar = false;
  return job;
}

// Trains the toy job and returns its final evaluation; the losses are in output_dir/metrics.jsonl.
core::Evaluation train_toy(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  core::Layout layout = core::make_layout(job, std::move(world));
  auto model = std::make_shared<testing::ToyMlp>();
  models::init_parameters(*model, 7, 0.5);
  auto task = std::make_shared<testing::ToyRegression>(model, layout, job.training.global_batch_size,
                                                       job.training.micro_batch_size);
  Trainer trainer(job, JobParts{layout, model, task});
  auto result = trainer.train();
  EXPECT_TRUE(result.has_value());
  return result ? *result : core::Evaluation{};
}

std::vector<double> losses(const std::string& output_dir) {
  std::vector<double> out;
  std::ifstream in(output_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("loss")) out.push_back(record["loss"].get<double>());
  }
  return out;
}

std::string scratch_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  return dir.string();
}

TEST(ToyTask, TrainsThroughTheTrainerInOneProcess) {
  const std::string dir = scratch_dir("loom-toy-one-process");
  const core::Evaluation result = train_toy(toy_job(dir, 0), nullptr);
  const auto l = losses(dir);
  ASSERT_EQ(l.size(), 30u);
  EXPECT_LT(l.back(), 0.5 * l.front()) << "first " << l.front() << ", last " << l.back();
  ASSERT_EQ(result.metrics.size(), 1u);
  EXPECT_EQ(result.metrics[0].first, "eval_mse");
  EXPECT_LT(result.metrics[0].second, l.front());
  // The checkpoint holds the toy model's weights under its own names, and its config.
  EXPECT_TRUE(fs::exists(dir + "/step-00000030/model.safetensors"));
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir + "/step-00000030/config.json"))["model_type"],
            "loom_toy_mlp");
}

TEST(ToyTask, TrainerRefusesARunDirectoryInUse) {
  const std::string dir = scratch_dir("loom-toy-in-use");
  const checkpoint::RunDirectoryLock other(dir);  // as another loom train on this directory would
  const config::JobConfig job = toy_job(dir, 0);
  core::Layout layout = core::make_layout(job, nullptr);
  auto model = std::make_shared<testing::ToyMlp>();
  auto task = std::make_shared<testing::ToyRegression>(model, layout, job.training.global_batch_size,
                                                       job.training.micro_batch_size);
  Trainer trainer(job, JobParts{layout, model, task});
  try {
    trainer.train();
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("training.output_dir: {} is in use by another loom train (pid {}); wait for it to "
                          "end or choose another output directory",
                          dir, ::getpid()));
  }
  EXPECT_EQ(trainer.step(), 0);
  EXPECT_FALSE(fs::exists(dir + "/metrics.jsonl"));  // refused before writing anything
  EXPECT_FALSE(fs::exists(dir + "/job.yaml"));
}

TEST(ToyTaskUnderLoomRun, DataParallelZero1AndFsdpGiveTheOneProcessLosses) {
  const dist::LaunchEnv env = dist::launch_env_from_process();
  if (env.world_size != 2) GTEST_SKIP() << "runs as the ranks of loom run -n 2";
  auto world = dist::Comm::connect(env, std::chrono::seconds(60));
  const std::string base = fmt::format("loom-toy-{}", env.master_port);
  // Each rank trains the one-process run itself (its own directory), then the two together.
  const std::string alone = scratch_dir(fmt::format("{}-alone-{}", base, env.rank));
  train_toy(toy_job(alone, 0), nullptr);
  const auto expected = losses(alone);
  ASSERT_EQ(expected.size(), 30u);
  for (int64_t zero : {0, 1, 3}) {
    const std::string dir = (fs::temp_directory_path() / fmt::format("{}-zero{}", base, zero)).string();
    if (env.rank == 0) fs::remove_all(dir);
    world->barrier();
    train_toy(toy_job(dir, zero), world);
    if (env.rank != 0) continue;  // rank 0 writes the metrics
    const auto got = losses(dir);
    ASSERT_EQ(got.size(), expected.size()) << "zero " << zero;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], expected[i], 1e-6) << "zero " << zero << ", step " << i + 1;
  }
}

}  // namespace
}  // namespace loom::train
