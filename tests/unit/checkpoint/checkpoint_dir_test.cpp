// Atomic checkpoint directories: staging, commit and replacement, listing by step, pruning.
#include "loom/checkpoint/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <set>

#include "loom/util/errors.h"
#include "temp_dir.h"

namespace loom::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::set<std::string> entries_of(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// A committed checkpoint holding one file `step.txt` with `text`.
void make_checkpoint(const std::string& root, int64_t step, const std::string& text) {
  StagedDirectory staged(root, checkpoint_name(step));
  write_text_file_durable(staged.path() + "/step.txt", text);
  staged.commit();
}

TEST(CheckpointNames, FormatAndParse) {
  EXPECT_EQ(checkpoint_name(100), "step-00000100");
  EXPECT_EQ(checkpoint_name(0), "step-00000000");
  EXPECT_EQ(checkpoint_name(123456789), "step-123456789");
  EXPECT_EQ(checkpoint_step("runs/a/step-00000100"), 100);
  EXPECT_EQ(checkpoint_step("runs/a/step-00000100/"), 100);
  EXPECT_EQ(checkpoint_step("step-123456789"), 123456789);
  EXPECT_THROW(checkpoint_name(-1), CheckpointError);
  EXPECT_THROW(checkpoint_step("runs/a/step-100"), CheckpointError);
  EXPECT_THROW(checkpoint_step("runs/a/.tmp-step-00000100-5"), CheckpointError);
  EXPECT_THROW(checkpoint_step("runs/a/step-0000010x"), CheckpointError);
}

TEST(StagedDirectory, CommitMovesFilesIntoPlace) {
  TempDir root;
  const std::string run = root.file("run");  // created on demand
  StagedDirectory staged(run, "step-00000010");
  EXPECT_EQ(staged.final_path(), run + "/step-00000010");
  EXPECT_EQ(fs::path(staged.path()).filename().string(), ".tmp-step-00000010-" + std::to_string(::getpid()));
  EXPECT_TRUE(fs::is_directory(staged.path()));
  write_text_file_durable(staged.path() + "/a.txt", "alpha");
  fs::create_directory(staged.path() + "/sub");
  write_text_file_durable(staged.path() + "/sub/b.txt", "beta");
  EXPECT_FALSE(fs::exists(staged.final_path()));
  staged.commit();
  EXPECT_TRUE(staged.committed());
  EXPECT_EQ(read_text_file(run + "/step-00000010/a.txt"), "alpha");
  EXPECT_EQ(read_text_file(run + "/step-00000010/sub/b.txt"), "beta");
  EXPECT_EQ(entries_of(run), (std::set<std::string>{"step-00000010"}));
  EXPECT_THROW(staged.commit(), CheckpointError);
}

TEST(StagedDirectory, WithoutCommitLeavesNothingAndKeepsPreviousCheckpoint) {
  TempDir root;
  const std::string run = root.path().string();
  make_checkpoint(run, 100, "one hundred");
  {
    StagedDirectory next(run, checkpoint_name(200));
    write_text_file_durable(next.path() + "/step.txt", "two hundred");
    // A second attempt at an existing name, abandoned too.
    StagedDirectory again(run, checkpoint_name(100) + "x");
    StagedDirectory same(run + "/nested", checkpoint_name(100));
    write_text_file_durable(same.path() + "/step.txt", "replacement");
  }
  EXPECT_FALSE(fs::exists(run + "/step-00000200"));
  EXPECT_EQ(entries_of(run), (std::set<std::string>{"step-00000100", "nested"}));
  EXPECT_TRUE(fs::is_empty(run + "/nested"));
  EXPECT_EQ(read_text_file(run + "/step-00000100/step.txt"), "one hundred");
  EXPECT_EQ(latest_checkpoint(run), run + "/step-00000100");

  {
    // Abandoning a replacement of an existing checkpoint leaves that checkpoint as it was.
    StagedDirectory replacement(run, checkpoint_name(100));
    write_text_file_durable(replacement.path() + "/step.txt", "replacement");
  }
  EXPECT_EQ(read_text_file(run + "/step-00000100/step.txt"), "one hundred");
}

TEST(StagedDirectory, CommitReplacesExistingDirectory) {
  TempDir root;
  const std::string run = root.path().string();
  {
    StagedDirectory first(run, "step-00000100");
    write_text_file_durable(first.path() + "/old-only.txt", "old");
    write_text_file_durable(first.path() + "/step.txt", "old");
    first.commit();
  }
  make_checkpoint(run, 100, "new");
  EXPECT_EQ(read_text_file(run + "/step-00000100/step.txt"), "new");
  EXPECT_FALSE(fs::exists(run + "/step-00000100/old-only.txt"));
  EXPECT_EQ(entries_of(run), (std::set<std::string>{"step-00000100"}));
}

TEST(ListCheckpoints, SortsByStepAndIgnoresOtherEntries) {
  TempDir root;
  const std::string run = root.path().string();
  EXPECT_TRUE(list_checkpoints(run + "/absent").empty());
  EXPECT_FALSE(latest_checkpoint(run + "/absent").has_value());
  for (int64_t step : {900, 100000000, 1000, 50}) make_checkpoint(run, step, std::to_string(step));
  // Leftovers of a crash and unrelated entries.
  fs::create_directory(run + "/.tmp-step-00005000-12345");
  fs::create_directory(run + "/step-12");
  fs::create_directory(run + "/stepping");
  write_text_file_durable(run + "/step-00009000", "a file, not a directory");
  write_text_file_durable(run + "/metrics.jsonl", "{}\n");
  EXPECT_EQ(list_checkpoints(run),
            (std::vector<std::string>{run + "/step-00000050", run + "/step-00000900", run + "/step-00001000",
                                      run + "/step-100000000"}));
  EXPECT_EQ(latest_checkpoint(run), run + "/step-100000000");
}

TEST(LatestCheckpoint, IgnoresTmpLeftovers) {
  TempDir root;
  const std::string run = root.path().string();
  make_checkpoint(run, 300, "300");
  fs::create_directory(run + "/.tmp-step-00000500-4242");
  write_text_file_durable(run + "/.tmp-step-00000500-4242/step.txt", "half");
  EXPECT_EQ(latest_checkpoint(run), run + "/step-00000300");
}

TEST(PruneCheckpoints, KeepsNewestAndRemovesStaleStaging) {
  TempDir root;
  const std::string run = root.path().string();
  for (int64_t step : {100, 200, 300, 400, 500}) make_checkpoint(run, step, std::to_string(step));
  fs::create_directory(run + "/.tmp-step-00000600-4242");
  fs::create_directory(run + "/.tmp-step-00000100-4242-old");
  write_text_file_durable(run + "/config.yaml", "training: {}\n");
  StagedDirectory in_progress(run, checkpoint_name(700));  // this process's: kept

  prune_checkpoints(run, 2);
  EXPECT_EQ(list_checkpoints(run),
            (std::vector<std::string>{run + "/step-00000400", run + "/step-00000500"}));
  EXPECT_EQ(read_text_file(run + "/step-00000500/step.txt"), "500");
  EXPECT_EQ(entries_of(run), (std::set<std::string>{"step-00000400", "step-00000500", "config.yaml",
                                                    fs::path(in_progress.path()).filename().string()}));

  prune_checkpoints(run, 0);  // keeps all
  EXPECT_EQ(list_checkpoints(run).size(), 2u);
  prune_checkpoints(run, 5);
  EXPECT_EQ(list_checkpoints(run).size(), 2u);
  prune_checkpoints(run, 1);
  EXPECT_EQ(list_checkpoints(run), std::vector<std::string>{run + "/step-00000500"});
  prune_checkpoints(run + "/absent", 1);  // nothing to do
}

TEST(TextFiles, WriteDurableAndRead) {
  TempDir root;
  const std::string path = root.file("state.json");
  write_text_file_durable(path, "first");
  write_text_file_durable(path, std::string("second\0with nul", 15));
  EXPECT_EQ(read_text_file(path), std::string("second\0with nul", 15));
  EXPECT_EQ(entries_of(root.path()), std::set<std::string>{"state.json"});
  write_text_file_durable(root.file("empty.txt"), "");
  EXPECT_EQ(read_text_file(root.file("empty.txt")), "");
  try {
    read_text_file(root.file("absent.txt"));
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(root.file("absent.txt")), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_text_file(root.path().string()), CheckpointError);
  EXPECT_THROW(write_text_file_durable(root.file("no-such-dir/x.txt"), "x"), CheckpointError);
}

}  // namespace
}  // namespace loom::checkpoint
