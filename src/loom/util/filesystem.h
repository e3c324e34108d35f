// File-system helpers that must behave the same whichever libtorch Loom is linked with.
#pragma once
#include <string>
#include <system_error>

namespace loom {

// Removes `path` and everything under it (symbolic links are removed, never followed). A path
// that does not exist is not an error. On failure `error` holds the first errno met.
//
// Loom does not call std::filesystem::remove_all: PyTorch 2.x wheels export their own copy of
// remove_all(path, error_code&), which wins symbol lookup over libstdc++'s and crashes on any
// non-empty directory (seen with torch 2.11+cu130).
void remove_tree(const std::string& path, std::error_code& error);

// Why `path` cannot be read as a file ("does not exist", "is a directory", "is a special file (a
// device, pipe or socket), not a regular file", or the OS reason), or "" when it is a regular file
// (or a link to one). A stream opened on a directory reads as empty or throws from inside the
// library that reads it, and /dev/zero never ends: callers refuse both up front, naming the path.
std::string unreadable_file_reason(const std::string& path);

}  // namespace loom
