#include "loom/checkpoint/durable_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/util/errors.h"

namespace loom::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string errno_text() { return std::strerror(errno); }

std::string parent_directory(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void fsync_fd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    std::string reason = errno_text();
    ::close(fd);
    throw CheckpointError(fmt::format("cannot fsync '{}': {}", path, reason));
  }
}

}  // namespace

DurableFileWriter::DurableFileWriter(const std::string& path) : path_(path) {
  fs::path target(path);
  if (target.filename().empty()) {
    throw CheckpointError(fmt::format("cannot write '{}': the path names no file", path));
  }
  temp_path_ =
      (target.parent_path() / fmt::format(".{}.tmp-{}", target.filename().string(), ::getpid())).string();
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw CheckpointError(
        fmt::format("cannot create '{}' (temporary file for '{}'): {}", temp_path_, path, errno_text()));
  }
}

DurableFileWriter::~DurableFileWriter() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(temp_path_.c_str());
}

void DurableFileWriter::write(const void* data, size_t size) {
  if (committed_) throw CheckpointError(fmt::format("'{}' was already committed", path_));
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    // Linux writes at most ~2 GiB per call; loop over short writes and EINTR.
    ssize_t written = ::write(fd_, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("cannot write '{}': {}", temp_path_, errno_text()));
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

void DurableFileWriter::commit() {
  if (committed_) throw CheckpointError(fmt::format("'{}' was already committed", path_));
  if (::fsync(fd_) != 0) {
    throw CheckpointError(fmt::format("cannot fsync '{}': {}", temp_path_, errno_text()));
  }
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    throw CheckpointError(fmt::format("cannot close '{}': {}", temp_path_, errno_text()));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", temp_path_, path_, errno_text()));
  }
  committed_ = true;
  fsync_directory(parent_directory(path_));
}

void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(fmt::format("cannot open '{}' to fsync it: {}", path, errno_text()));
  fsync_fd(fd, path);
  ::close(fd);
}

void fsync_directory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError(fmt::format("cannot open directory '{}' to fsync it: {}", path, errno_text()));
  }
  fsync_fd(fd, path);
  ::close(fd);
}

}  // namespace loom::checkpoint
