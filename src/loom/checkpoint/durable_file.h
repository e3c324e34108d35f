// Crash-safe file writing for checkpoints: a file appears at its final path complete or not at
// all (temporary sibling + fsync + rename + fsync of the directory).
#pragma once
#include <cstddef>
#include <string>

namespace loom::checkpoint {

// Writes a file in pieces to `<dir>/.<name>.tmp-<pid>`; commit() fsyncs it and renames it onto
// `path`. Destroyed without commit(), it removes the temporary file and leaves `path` untouched.
class DurableFileWriter {
 public:
  explicit DurableFileWriter(const std::string& path);
  ~DurableFileWriter();
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;

  void write(const void* data, size_t size);
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// fsync a regular file / a directory by path; CheckpointError naming the path on failure.
void fsync_file(const std::string& path);
void fsync_directory(const std::string& path);

}  // namespace loom::checkpoint
