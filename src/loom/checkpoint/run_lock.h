// One writer per run directory: an exclusive flock on `<dir>/.loom.lock`, which names the holder's
// pid. The kernel drops the lock when the holder's process ends, however it ends (kill -9 leaves
// no stale lock; the file stays, naming the last holder, and is reused by the next).
#pragma once
#include <string>

namespace loom::checkpoint {

class RunDirectoryLock {
 public:
  static constexpr const char* kFileName = ".loom.lock";

  // Creates `dir` and its lock file as needed, takes the lock without waiting and writes this
  // process's pid into the file. CheckpointError "<dir> is in use by another loom train (pid N);
  // ..." when another open file description holds the lock (another process, or another
  // RunDirectoryLock in this one), and naming the file and the OS reason when it cannot be
  // created, locked or written.
  explicit RunDirectoryLock(const std::string& dir);
  ~RunDirectoryLock();  // releases the lock
  RunDirectoryLock(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock& operator=(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

  // The lock file.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace loom::checkpoint
