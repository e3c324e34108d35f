#include "loom/util/filesystem.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace loom {
namespace {

// nftw visits children before their directory (FTW_DEPTH); FTW_PHYS reports links as links.
int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  const int rc = type == FTW_DP ? ::rmdir(path) : ::unlink(path);
  return rc == 0 || errno == ENOENT ? 0 : errno;
}

}  // namespace

void remove_tree(const std::string& path, std::error_code& error) {
  error.clear();
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) {
    if (errno != ENOENT) error.assign(errno, std::generic_category());
    return;
  }
  const int rc = ::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS);
  if (rc > 0) {
    error.assign(rc, std::generic_category());
  } else if (rc < 0) {
    error.assign(errno, std::generic_category());
  }
}

std::string unreadable_file_reason(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0)
    return errno == ENOENT ? "does not exist" : std::error_code(errno, std::generic_category()).message();
  if (S_ISREG(info.st_mode)) return "";
  if (S_ISDIR(info.st_mode)) return "is a directory";
  return "is a special file (a device, pipe or socket), not a regular file";
}

}  // namespace loom
