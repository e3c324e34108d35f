// Atomic checkpoint directories: staging, commit and replacement, listing by step, pruning.
#include "loom/checkpoint/checkpoint_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
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

// The pid of a process that has ended (a child reaped at once; its pid is not reused this soon).
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  EXPECT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  return static_cast<long>(child);
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
  const long dead = dead_pid();
  fs::create_directory(fmt::format("{}/.tmp-step-00000600-{}", run, dead));
  fs::create_directory(fmt::format("{}/.tmp-step-00000100-{}-old", run, dead));
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

TEST(PruneCheckpoints, DeletesByRenameAndLeavesLiveProcessesStaging) {
  TempDir root;
  const std::string run = root.path().string();
  for (int64_t step : {100, 200, 300, 400}) make_checkpoint(run, step, std::to_string(step));
  const long own = static_cast<long>(::getpid()), dead = dead_pid(), live = static_cast<long>(::getppid());
  // A prune that crashed while removing files: the checkpoint had already left its step-* name, so
  // resume never sees it.
  const std::string crashed = fmt::format("{}/.tmp-delete-step-00000050-{}", run, dead);
  fs::create_directories(crashed + "/sub");
  write_text_file_durable(crashed + "/step.txt", "half");
  // One of this process's own deletions left behind, and a live process's write in progress.
  const std::string own_leftover = fmt::format("{}/.tmp-delete-step-00000060-{}", run, own);
  fs::create_directory(own_leftover);
  const std::string live_export = fmt::format("{}/.tmp-exported-{}", run, live);
  fs::create_directory(live_export);
  write_text_file_durable(live_export + "/config.json", "{}");
  const std::string live_staging = fmt::format("{}/.tmp-step-00000500-{}", run, live);
  fs::create_directory(live_staging);
  fs::create_directory(run + "/.tmp-not-loom");  // no pid: not Loom's, left alone
  EXPECT_EQ(latest_checkpoint(run), run + "/step-00000400");

  prune_checkpoints(run, 2);
  EXPECT_EQ(list_checkpoints(run),
            (std::vector<std::string>{run + "/step-00000300", run + "/step-00000400"}));
  EXPECT_EQ(read_text_file(run + "/step-00000300/step.txt"), "300");
  EXPECT_EQ(entries_of(run), (std::set<std::string>{
                                 "step-00000300", "step-00000400", fs::path(live_export).filename().string(),
                                 fs::path(live_staging).filename().string(), ".tmp-not-loom"}));
  EXPECT_EQ(read_text_file(live_export + "/config.json"), "{}");
}

// A prune stopped half-way through removing a checkpoint's files (here: a folder in it that the
// pruning process may not empty, in a child running as nobody, as root ignores permissions) has
// already taken the checkpoint out of step-*, and the next prune, in another process, finishes it.
TEST(PruneCheckpoints, InterruptedRemovalLeavesNoPartialCheckpoint) {
  TempDir root;
  const std::string run = root.file("run");
  for (int64_t step : {100, 200, 300}) make_checkpoint(run, step, std::to_string(step));
  fs::create_directory(run + "/step-00000100/locked");
  write_text_file_durable(run + "/step-00000100/locked/weights.bin", "w");
  const auto open = fs::perms::all;
  for (const std::string& dir : {root.path().string(), run, run + "/step-00000100", run + "/step-00000200"})
    fs::permissions(dir, open);
  fs::permissions(run + "/step-00000100/locked", fs::perms::owner_read | fs::perms::owner_exec |
                                                     fs::perms::group_read | fs::perms::group_exec |
                                                     fs::perms::others_read | fs::perms::others_exec);
  const pid_t child = ::fork();
  if (child == 0) {
    if (::geteuid() == 0 && ::setuid(65534) != 0) ::_exit(3);
    try {
      prune_checkpoints(run, 1);
    } catch (const CheckpointError&) {
      ::_exit(0);  // stopped by the folder it may not empty, as it should be
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(1);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 3) GTEST_SKIP() << "cannot run a process as nobody here";
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child's prune did not stop at the folder it may not empty";
  // Both old checkpoints left step-* before any file went; the removal of step-00000100 stopped
  // under its staging name (whether step-00000200's went first depends on the listing order).
  EXPECT_EQ(list_checkpoints(run), std::vector<std::string>{run + "/step-00000300"});
  EXPECT_EQ(latest_checkpoint(run), run + "/step-00000300");
  const std::string half = fmt::format(".tmp-delete-step-00000100-{}", child);
  EXPECT_TRUE(fs::exists(run + "/" + half + "/locked/weights.bin"));
  std::set<std::string> left = entries_of(run);
  left.erase(fmt::format(".tmp-delete-step-00000200-{}", child));
  EXPECT_EQ(left, (std::set<std::string>{"step-00000300", half}));

  fs::permissions(run + "/" + half + "/locked", fs::perms::owner_all);
  prune_checkpoints(run, 1);  // the child has ended: its deletion is finished
  EXPECT_EQ(entries_of(run), std::set<std::string>{"step-00000300"});
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
