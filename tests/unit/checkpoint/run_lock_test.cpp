// The run directory's lock: one holder at a time, its pid in the file and in a refusal, free again
// once released. (Release by the kernel when the holder is killed: tests/e2e/run_lock.sh.)
#include "loom/checkpoint/run_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "loom/util/errors.h"
#include "temp_dir.h"

namespace loom::checkpoint {
namespace {

using testing::expect_checkpoint_error;
using testing::read_bytes;
using testing::TempDir;

TEST(RunDirectoryLock, SecondHolderIsRefusedWithTheFirstsPid) {
  TempDir root;
  const std::string run = root.file("run");  // created by the lock
  const std::string pid = std::to_string(::getpid());
  std::optional<RunDirectoryLock> first(run);
  EXPECT_EQ(first->path(), run + "/.loom.lock");
  EXPECT_EQ(read_bytes(run + "/.loom.lock"), pid + "\n");
  // flock belongs to the open file description, so a second open in this process is refused too.
  expect_checkpoint_error([&] { RunDirectoryLock second(run); },
                          {run + " is in use by another loom train (pid " + pid + ")", "wait for it to end"});
  EXPECT_EQ(read_bytes(run + "/.loom.lock"), pid + "\n");  // the refused one changed nothing

  RunDirectoryLock moved = std::move(*first);  // still held
  first.reset();
  expect_checkpoint_error([&] { RunDirectoryLock second(run); }, {"(pid " + pid + ")"});
  { RunDirectoryLock released = std::move(moved); }
  RunDirectoryLock again(run);
  EXPECT_EQ(read_bytes(run + "/.loom.lock"), pid + "\n");
}

TEST(RunDirectoryLock, StalePidInAnUnlockedFileIsReplaced) {
  TempDir root;
  const std::string run = root.path().string();
  testing::write_bytes(run + "/.loom.lock", "999999999\n");  // a holder killed with kill -9
  RunDirectoryLock lock(run);
  EXPECT_EQ(read_bytes(run + "/.loom.lock"), std::to_string(::getpid()) + "\n");
}

TEST(RunDirectoryLock, UnusableDirectoryIsNamed) {
  TempDir root;
  testing::write_bytes(root.file("file"), "not a directory");
  expect_checkpoint_error([&] { RunDirectoryLock lock(root.file("file")); }, {root.file("file")});
  expect_checkpoint_error([&] { RunDirectoryLock lock(root.file("file") + "/run"); }, {root.file("file")});
}

}  // namespace
}  // namespace loom::checkpoint
