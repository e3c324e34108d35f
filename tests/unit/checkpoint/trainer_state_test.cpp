// trainer_state.json read back with every field checked (a truncated or mistyped file, a step that
// disagrees with its directory), and resume's choice of the newest complete checkpoint.
#include "loom/checkpoint/trainer_state.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/safetensors.h"
#include "temp_dir.h"

namespace loom::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::expect_checkpoint_error;
using testing::TempDir;
using testing::write_bytes;

TrainerState state_at(int64_t step) {
  TrainerState state;
  state.step = step;
  state.global_batch_size = 16;
  state.micro_batch_size = 4;
  state.seed = 7;
  state.skipped_nonfinite_steps = 1;
  return state;
}

// A checkpoint of every file Loom's trainer writes, committed as step-N.
std::string make_checkpoint(const std::string& root, int64_t step) {
  StagedDirectory staged(root, checkpoint_name(step));
  save_safetensors(staged.path() + "/model.safetensors", {{"w", at::ones({2})}});
  save_safetensors(staged.path() + "/optimizer.safetensors", {{"step", at::tensor(step)}});
  write_text_file_durable(staged.path() + "/config.json", "{}\n");
  write_text_file_durable(staged.path() + "/" + kTrainerStateFile, trainer_state_json(state_at(step)));
  staged.commit();
  return staged.final_path();
}

TEST(TrainerState, RoundTripsEveryField) {
  TempDir dir;
  const std::string checkpoint = make_checkpoint(dir.path().string(), 12);
  const TrainerState state = read_trainer_state(checkpoint);
  EXPECT_EQ(state.step, 12);
  EXPECT_EQ(state.global_batch_size, 16);
  EXPECT_EQ(state.micro_batch_size, 4);
  EXPECT_EQ(state.seed, 7);
  EXPECT_EQ(state.skipped_nonfinite_steps, 1);
  EXPECT_EQ(state.data_position(), 12 * 16);
  // Checkpoints written before skipped_nonfinite_steps was kept resume with none skipped.
  write_bytes(
      checkpoint + "/trainer_state.json",
      R"({"step": 12, "global_batch_size": 16, "micro_batch_size": 4, "data_position": 192, "seed": 7})");
  EXPECT_EQ(read_trainer_state(checkpoint).skipped_nonfinite_steps, 0);
}

// Raw JSON-library messages named nothing; a step of 1004 in step-00000004 resumed at step 1004 and
// trained nothing.
TEST(TrainerState, BadFilesAreNamedErrors) {
  TempDir dir;
  const std::string checkpoint = make_checkpoint(dir.path().string(), 4);
  const std::string file = checkpoint + "/trainer_state.json";
  write_bytes(file, R"({"step": 4, "global_batch_s)");
  expect_checkpoint_error([&] { read_trainer_state(checkpoint); }, {file, "not valid JSON", "truncated"});
  write_bytes(file, R"({"step": "4", "global_batch_size": 16})");
  expect_checkpoint_error([&] { read_trainer_state(checkpoint); },
                          {file, "field 'step' must be an integer >= 0, got \"4\""});
  write_bytes(file, R"({"step": 4})");
  expect_checkpoint_error([&] { read_trainer_state(checkpoint); },
                          {file, "missing field 'global_batch_size'"});
  write_bytes(file, R"([4, 16])");
  expect_checkpoint_error([&] { read_trainer_state(checkpoint); }, {file, "expected a JSON object"});
  write_bytes(file, R"({"step": 4, "global_batch_size": 16, "data_position": 60})");
  expect_checkpoint_error([&] { read_trainer_state(checkpoint); }, {file, "data_position 60 is not step 4"});
  write_bytes(file, trainer_state_json(state_at(1004)));
  expect_checkpoint_error([&] { read_trainer_state(checkpoint); },
                          {file, "step 1004 disagrees with the directory's name step-00000004"});
  fs::remove(file);
  expect_checkpoint_error([&] { read_trainer_state(checkpoint); }, {file});
}

// An empty or partial newest step-* stopped resume: auto although an older complete one existed.
TEST(TrainerState, ResumeTakesTheNewestCompleteCheckpoint) {
  TempDir dir;
  const std::string root = dir.path().string();
  EXPECT_FALSE(latest_complete_checkpoint(root));
  const std::string good = make_checkpoint(root, 2);
  EXPECT_EQ(latest_complete_checkpoint(root), good);
  fs::create_directory(dir.path() / "step-00000009");  // empty
  const std::string truncated = make_checkpoint(root, 6);
  const std::string model = truncated + "/model.safetensors";
  const auto size = fs::file_size(model);
  fs::resize_file(model, size - 3);
  const std::string mismatched = make_checkpoint(root, 4);
  write_bytes(mismatched + "/trainer_state.json", trainer_state_json(state_at(1004)));
  EXPECT_EQ(incomplete_checkpoint(root + "/step-00000009"), "config.json is missing");
  EXPECT_NE(incomplete_checkpoint(truncated)->find(model), std::string::npos)
      << *incomplete_checkpoint(truncated);
  EXPECT_NE(incomplete_checkpoint(mismatched)->find("disagrees"), std::string::npos);
  EXPECT_FALSE(incomplete_checkpoint(good));
  EXPECT_EQ(latest_complete_checkpoint(root), good);
  EXPECT_EQ(resolve_model_directory(root), good);
}

}  // namespace
}  // namespace loom::checkpoint
