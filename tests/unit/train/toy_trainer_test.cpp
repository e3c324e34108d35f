// The trainer assumes no model family, task or parallel mode: a test-only MLP and regression task
// (toy_task.h) train through the same Trainer as Qwen2-VL, in one process and, as two ranks of
// `loom run -n 2` (tests/e2e/generic_trainer.sh), under data parallelism, ZeRO-1 and FSDP with the
// one-process run's losses to 1e-6 (absolute; the
// summation order over ranks differs, so the last bits do).
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/run_lock.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/checkpoint/trainer_state.h"
#include "loom/dist/launch_env.h"
#include "loom/models/converters.h"
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
  at::set_num_threads(static_cast<int>(job.training.threads));  // what loom train does first
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

// The toy task with the targets of some steps' first micro-batch made NaN (a poisoned sample).
class PoisonedToy : public testing::ToyRegression {
 public:
  PoisonedToy(std::shared_ptr<testing::ToyMlp> model, const core::Layout& layout,
              const config::JobConfig& job, std::set<int64_t> poisoned_steps)
      : ToyRegression(std::move(model), layout, job.training.global_batch_size,
                      job.training.micro_batch_size),
        poisoned_(std::move(poisoned_steps)) {}
  core::StepData step_data(int64_t step) const override {
    core::StepData data = ToyRegression::step_data(step);
    if (poisoned_.count(step + 1)) {  // steps are counted from 1 in metrics and messages
      auto poisoned =
          std::make_shared<testing::ToyBatch>(static_cast<const testing::ToyBatch&>(*data.micro_batches[0]));
      poisoned->y = poisoned->y.clone().fill_(std::nan(""));
      data.micro_batches[0] = poisoned;
    }
    return data;
  }

 private:
  std::set<int64_t> poisoned_;
};

// Trains the toy job with `poisoned` steps; the TrainingError's message if it stops, else "".
std::string train_poisoned(const config::JobConfig& job, std::set<int64_t> poisoned) {
  at::set_num_threads(1);
  core::Layout layout = core::make_layout(job, nullptr);
  auto model = std::make_shared<testing::ToyMlp>();
  models::init_parameters(*model, 7, 0.5);
  auto task = std::make_shared<PoisonedToy>(model, layout, job, std::move(poisoned));
  Trainer trainer(job, JobParts{layout, model, task});
  try {
    trainer.train();
  } catch (const TrainingError& e) {
    return e.what();
  }
  return "";
}

std::vector<nlohmann::json> metric_lines(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A NaN loss was written as null and training went on, saving the checkpoint.
TEST(ToyTask, ANonFiniteStepStopsTrainingBeforeAnyUpdateOrSave) {
  const std::string dir = scratch_dir("loom-toy-nonfinite-stop");
  config::JobConfig job = toy_job(dir, 0);
  job.training.steps = 8;
  job.training.save_every = 2;
  const std::string message = train_poisoned(job, {5});
  EXPECT_NE(message.find("step 5: the loss is nan"), std::string::npos) << message;
  EXPECT_NE(message.find(dir + "/step-00000004 stays the last good checkpoint"), std::string::npos)
      << message;
  EXPECT_NE(message.find("training.skip_nonfinite_steps 0"), std::string::npos) << message;
  EXPECT_EQ(metric_lines(dir).size(), 4u);  // steps 1-4; step 5 is not recorded as trained
  EXPECT_EQ(checkpoint::list_checkpoints(dir).back(), dir + "/step-00000004");
}

// With training.skip_nonfinite_steps: N, up to N such steps are dropped without an update (the
// weights after the step equal those before it), counted in metrics and in the checkpoint's state.
TEST(ToyTask, SkipNonfiniteStepsDropsThemWithoutAnUpdate) {
  const std::string dir = scratch_dir("loom-toy-nonfinite-skip");
  config::JobConfig job = toy_job(dir, 0);
  job.training.steps = 8;
  job.training.save_every = 1;
  job.training.keep_last = 10;
  job.training.skip_nonfinite_steps = 2;
  EXPECT_EQ(train_poisoned(job, {3, 6}), "");
  const auto lines = metric_lines(dir);
  ASSERT_EQ(lines.size(), 9u);  // 8 steps and the final evaluation
  for (int64_t step = 1; step <= 8; ++step) {
    const nlohmann::json& line = lines[static_cast<size_t>(step - 1)];
    EXPECT_EQ(line["step"], step);
    EXPECT_EQ(line["loss"].is_null(), step == 3 || step == 6) << line.dump();
    EXPECT_EQ(line["skipped_nonfinite"], step < 3 ? 0 : step < 6 ? 1 : 2) << line.dump();
  }
  auto weights = [&](int64_t step) {
    checkpoint::SafetensorsReader reader(dir + "/" + checkpoint::checkpoint_name(step) +
                                         "/model.safetensors");
    std::vector<at::Tensor> out;
    for (const auto& name : reader.names()) out.push_back(reader.load(name));
    return out;
  };
  const auto before = weights(2), after = weights(3), next = weights(4);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(at::equal(before[i], after[i])) << "tensor " << i << " changed in the skipped step 3";
    EXPECT_FALSE(at::equal(after[i], next[i])) << "tensor " << i << " did not train in step 4";
  }
  EXPECT_EQ(checkpoint::read_trainer_state(dir + "/step-00000008").skipped_nonfinite_steps, 2);
  // A third one stops training: the count carries over a resume.
  job.training.steps = 10;
  job.training.resume = "auto";
  const std::string message = train_poisoned(job, {9});
  EXPECT_NE(message.find("step 9: the loss is nan"), std::string::npos) << message;
  EXPECT_NE(message.find("allows 2 such steps to be skipped, and 2 were"), std::string::npos) << message;
}

// The toy model with a parameter no layer reads, for a checkpoint that would hold a NaN while every
// loss stays finite.
class ToyWithSpare : public testing::ToyMlp {
 public:
  ToyWithSpare() { spare = register_parameter("spare", at::zeros({3})); }
  at::Tensor spare;
};

TEST(ToyTask, ACheckpointWithNonFiniteWeightsIsNeverSaved) {
  const std::string dir = scratch_dir("loom-toy-nonfinite-weights");
  config::JobConfig job = toy_job(dir, 0);
  job.training.steps = 2;
  job.model.freeze = {"spare"};
  core::Layout layout = core::make_layout(job, nullptr);
  auto model = std::make_shared<ToyWithSpare>();
  models::init_parameters(*model, 7, 0.5);
  {
    at::NoGradGuard no_grad;
    model->spare.fill_(std::numeric_limits<float>::infinity());
  }
  models::convert_model(*model, job);
  auto task = std::make_shared<testing::ToyRegression>(model, layout, 16, 4);
  Trainer trainer(job, JobParts{layout, model, task});
  try {
    trainer.train();
    ADD_FAILURE() << "expected a TrainingError";
  } catch (const TrainingError& e) {
    EXPECT_EQ(std::string(e.what()),
              "step 2: parameter 'spare' holds NaN or infinite values; the checkpoint is not saved (the last "
              "one stays the last good state)");
  }
  EXPECT_TRUE(checkpoint::list_checkpoints(dir).empty());
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
