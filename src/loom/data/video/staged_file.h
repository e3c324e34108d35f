// A file written under a temporary name beside its destination and renamed into place when
// complete, so a reader of the destination sees the old file or the whole new one, never half.
#pragma once
#include <string>

namespace loom::data {

class StagedFile {
 public:
  // Creates an empty, uniquely named `<path>.tmp-XXXXXX` in path's directory. Throws DataError
  // naming `path` when it cannot (a missing or read-only directory). `what` names the kind of file
  // in messages ("GIF", "MP4").
  StagedFile(std::string path, std::string what);
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  // Removes the temporary file unless commit() has renamed it.
  ~StagedFile();

  // Where the writer writes.
  const std::string& temporary_path() const { return temporary_; }
  // Renames the temporary file to the destination (replacing any file there). Throws DataError
  // naming both on failure.
  void commit();

 private:
  std::string path_;
  std::string what_;
  std::string temporary_;
  bool committed_ = false;
};

}  // namespace loom::data
