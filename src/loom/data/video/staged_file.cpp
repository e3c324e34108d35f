#include "loom/data/video/staged_file.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>
#include <vector>

#include "loom/util/errors.h"

namespace loom::data {

StagedFile::StagedFile(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  // mkstemp picks a name no other writer (thread or process) holds, in the destination's directory
  // so the final rename stays on one file system.
  std::vector<char> name(path_.begin(), path_.end());
  for (const char c : std::string(".tmp-XXXXXX")) name.push_back(c);
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0)
    throw DataError(fmt::format("cannot write {} {}: cannot create a temporary file beside it: {}", what_,
                                path_, std::error_code(errno, std::generic_category()).message()));
  // mkstemp creates mode 0600; the finished file should be as readable as any other Loom writes.
  ::fchmod(fd, 0644);
  ::close(fd);
  temporary_ = name.data();
}

StagedFile::~StagedFile() {
  if (!committed_) std::remove(temporary_.c_str());
}

void StagedFile::commit() {
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0)
    throw DataError(fmt::format("cannot write {} {}: cannot rename {} to it: {}", what_, path_, temporary_,
                                std::error_code(errno, std::generic_category()).message()));
  committed_ = true;
}

}  // namespace loom::data
