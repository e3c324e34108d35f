#include "loom/checkpoint/run_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>  // flock
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "loom/util/errors.h"

namespace loom::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string errno_text() { return std::strerror(errno); }

// The pid the holder wrote into the lock file, or "unknown". A holder writes it just after taking
// the lock, so an empty file is given a moment to fill.
std::string holder_pid(int fd) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    char text[32] = {};
    const ssize_t size = ::pread(fd, text, sizeof(text) - 1, 0);
    if (size > 0) {
      std::string pid(text, static_cast<size_t>(size));
      pid = pid.substr(0, pid.find_first_not_of("0123456789"));
      if (!pid.empty()) return pid;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return "unknown";
}

}  // namespace

RunDirectoryLock::RunDirectoryLock(const std::string& dir) : path_((fs::path(dir) / kFileName).string()) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw CheckpointError(fmt::format("cannot create directory {}: {}", dir, error.message()));
  // Never O_TRUNC: the file may name the process that holds the lock. O_CLOEXEC: a started child
  // must not keep the lock alive after this process ends.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw CheckpointError(fmt::format("cannot open lock file {}: {}", path_, errno_text()));
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int reason = errno;
    const std::string message =
        reason == EWOULDBLOCK
            ? fmt::format(
                  "{} is in use by another loom train (pid {}); wait for it to end or choose "
                  "another output directory",
                  dir, holder_pid(fd_))
            : fmt::format("cannot lock {}: {}", path_, std::strerror(reason));
    ::close(fd_);
    fd_ = -1;
    throw CheckpointError(message);
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  errno = 0;
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const std::string message = fmt::format("cannot write lock file {}: {}", path_,
                                            errno != 0 ? errno_text() : std::string("short write"));
    ::close(fd_);  // releases the lock
    fd_ = -1;
    throw CheckpointError(message);
  }
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // the file stays; an unlocked file names no holder that counts
}

RunDirectoryLock::RunDirectoryLock(RunDirectoryLock&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

RunDirectoryLock& RunDirectoryLock::operator=(RunDirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

}  // namespace loom::checkpoint
