#include "loom/checkpoint/checkpoint_dir.h"

#include <fcntl.h>  // AT_FDCWD
#include <fmt/format.h>
#include <signal.h>  // kill
#include <stdio.h>   // renameat2, RENAME_EXCHANGE
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/checkpoint/durable_file.h"
#include "loom/checkpoint/trainer_state.h"
#include "loom/util/errors.h"
#include "loom/util/filesystem.h"

namespace loom::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTempPrefix = ".tmp-";
constexpr const char* kDeletePrefix = ".tmp-delete-";  // a pruned checkpoint, being removed
constexpr const char* kStepPrefix = "step-";
constexpr size_t kStepDigits = 8;

// Parses "step-<at least 8 digits>"; false for any other name.
bool parse_step_name(const std::string& name, int64_t* step) {
  const std::string prefix = kStepPrefix;
  if (name.size() < prefix.size() + kStepDigits || name.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  *step = std::stoll(digits);
  return true;
}

// The pid in a staging name `.tmp-<name>-<pid>` or `.tmp-<name>-<pid>-old`; -1 if there is none.
long staging_pid(std::string name) {
  const std::string old_suffix = "-old";
  if (name.size() > old_suffix.size() &&
      name.compare(name.size() - old_suffix.size(), old_suffix.size(), old_suffix) == 0) {
    name.resize(name.size() - old_suffix.size());
  }
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos || dash + 1 == name.size()) return -1;
  const std::string digits = name.substr(dash + 1);
  if (digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stol(digits);
}

fs::directory_iterator open_directory(const fs::path& dir) {
  std::error_code error;
  fs::directory_iterator it(dir, error);
  if (error)
    throw CheckpointError(fmt::format("cannot list directory '{}': {}", dir.string(), error.message()));
  return it;
}

void remove_tree_or_throw(const fs::path& path) {
  std::error_code error;
  remove_tree(path.string(), error);
  if (error) throw CheckpointError(fmt::format("cannot remove '{}': {}", path.string(), error.message()));
}

// fsyncs every file and directory under `dir`, children before their directory.
void fsync_tree(const fs::path& dir) {
  for (const fs::directory_entry& entry : open_directory(dir)) {
    if (entry.is_symlink()) continue;
    if (entry.is_directory()) {
      fsync_tree(entry.path());
    } else if (entry.is_regular_file()) {
      fsync_file(entry.path().string());
    }
  }
  fsync_directory(dir.string());
}

// Atomically swaps two existing paths; false where the filesystem cannot.
bool exchange_paths(const fs::path& a, const fs::path& b) {
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  throw CheckpointError(
      fmt::format("cannot exchange '{}' and '{}': {}", a.string(), b.string(), std::strerror(errno)));
#else
  return false;
#endif
}

// False only when no process has this pid (one of another user still counts as alive).
bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

void rename_path(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw CheckpointError(
        fmt::format("cannot rename '{}' to '{}': {}", from.string(), to.string(), std::strerror(errno)));
  }
}

}  // namespace

StagedDirectory::StagedDirectory(const std::string& root, const std::string& name) : root_(root) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    throw CheckpointError(
        fmt::format("checkpoint directory name '{}' must be a single path component", name));
  }
  std::error_code error;
  fs::create_directories(root, error);
  if (error) throw CheckpointError(fmt::format("cannot create directory '{}': {}", root, error.message()));
  final_path_ = (fs::path(root) / name).string();
  temp_path_ = (fs::path(root) / fmt::format("{}{}-{}", kTempPrefix, name, ::getpid())).string();
  remove_tree_or_throw(temp_path_);  // a leftover of an earlier attempt by a process with this pid
  fs::create_directory(temp_path_, error);
  if (error)
    throw CheckpointError(fmt::format("cannot create directory '{}': {}", temp_path_, error.message()));
}

StagedDirectory::~StagedDirectory() {
  if (committed_) return;
  std::error_code error;
  remove_tree(temp_path_, error);  // best effort: prune_checkpoints removes what is left
}

void StagedDirectory::commit() {
  if (committed_) throw CheckpointError(fmt::format("'{}' was already committed", final_path_));
  fsync_tree(temp_path_);
  const fs::path final_path(final_path_);
  const fs::path temp_path(temp_path_);
  if (fs::exists(fs::symlink_status(final_path))) {
    // Swap the new directory into place in one step where the filesystem allows; otherwise move
    // the old one aside first. Either way the old directory ends at a `.tmp-` name, which
    // prune_checkpoints removes should a crash stop us before we do.
    fs::path aside = temp_path;
    if (!exchange_paths(temp_path, final_path)) {
      aside = temp_path.string() + "-old";
      remove_tree_or_throw(aside);
      rename_path(final_path, aside);
      try {
        rename_path(temp_path, final_path);
      } catch (const CheckpointError&) {
        ::rename(aside.c_str(), final_path.c_str());  // put the previous directory back
        throw;
      }
    }
    committed_ = true;
    fsync_directory(root_);
    remove_tree_or_throw(aside);
  } else {
    rename_path(temp_path, final_path);
    committed_ = true;
  }
  fsync_directory(root_);
}

std::string checkpoint_name(int64_t step) {
  if (step < 0) throw CheckpointError(fmt::format("checkpoint step {} is negative", step));
  return fmt::format("{}{:0{}d}", kStepPrefix, step, kStepDigits);
}

int64_t checkpoint_step(const std::string& dir) {
  fs::path path(dir);
  if (path.filename().empty()) path = path.parent_path();  // trailing slash
  int64_t step = 0;
  if (!parse_step_name(path.filename().string(), &step)) {
    throw CheckpointError(fmt::format("'{}' is not a checkpoint directory (expected a name like {})", dir,
                                      checkpoint_name(100)));
  }
  return step;
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  if (!fs::is_directory(root, error)) return {};
  for (const fs::directory_entry& entry : open_directory(root)) {
    int64_t step = 0;
    if (entry.is_directory() && parse_step_name(entry.path().filename().string(), &step)) {
      found.emplace_back(step, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  std::vector<std::string> all = list_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string resolve_model_directory(const std::string& path) {
  if (fs::is_regular_file(fs::path(path) / "config.json")) return path;
  if (auto newest = latest_complete_checkpoint(path)) return *newest;
  throw CheckpointError(fmt::format(
      "{}: neither a model or checkpoint directory (no config.json) nor a run directory with checkpoints",
      path));
}

void prune_checkpoints(const std::string& root, int64_t keep_last) {
  std::error_code error;
  if (!fs::is_directory(root, error)) return;
  const long own_pid = static_cast<long>(::getpid());
  // Old checkpoints first leave their `step-*` name in one rename, so a crash while their files are
  // removed leaves a `.tmp-delete-*` directory, never a partial checkpoint that resume would pick.
  const std::vector<std::string> all = list_checkpoints(root);
  if (keep_last > 0 && all.size() > static_cast<size_t>(keep_last)) {
    for (size_t i = 0; i + keep_last < all.size(); ++i) {
      const fs::path from(all[i]);
      const fs::path to =
          from.parent_path() / fmt::format("{}{}-{}", kDeletePrefix, from.filename().string(), own_pid);
      remove_tree_or_throw(to);  // a leftover of an earlier process with this pid
      rename_path(from, to);
    }
    fsync_directory(root);
  }
  // This process's deletions, and the staging directories of processes that have ended. Its other
  // staging directories may be in use, and so may a live process's (say a loom export into this
  // directory): those are left for a later run.
  std::vector<fs::path> doomed;
  for (const fs::directory_entry& entry : open_directory(root)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kTempPrefix, 0) != 0 || !entry.is_directory()) continue;
    const long pid = staging_pid(name);
    const bool own_deletion = pid == own_pid && name.rfind(kDeletePrefix, 0) == 0;
    if (own_deletion || (pid > 0 && pid != own_pid && !process_alive(pid))) doomed.push_back(entry.path());
  }
  for (const fs::path& path : doomed) remove_tree_or_throw(path);
  fsync_directory(root);
}

void write_text_file_durable(const std::string& path, const std::string& text) {
  DurableFileWriter out(path);
  out.write(text.data(), text.size());
  out.commit();
}

std::string read_text_file(const std::string& path) {
  std::error_code error;
  if (fs::is_directory(path, error))
    throw CheckpointError(fmt::format("cannot read '{}': it is a directory", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("cannot open '{}' for reading: {}", path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw CheckpointError(fmt::format("cannot read '{}'", path));
  return text.str();
}

}  // namespace loom::checkpoint
