// Atomic checkpoint directories under a run's output directory: staged in `.tmp-*`, renamed
// into place on commit, listed / pruned by step (`step-00000100`).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::checkpoint {

// A directory that appears at `<root>/<name>` complete or not at all. Files are written into
// path() (`<root>/.tmp-<name>-<pid>`); commit() fsyncs them and renames the directory into
// place, replacing an existing directory of that name. Destroyed without commit(), it removes
// the temporary directory and leaves `<root>/<name>` as it was.
class StagedDirectory {
 public:
  StagedDirectory(const std::string& root, const std::string& name);
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  // Where to write files before commit().
  const std::string& path() const { return temp_path_; }
  // Where the directory will be after commit().
  const std::string& final_path() const { return final_path_; }
  bool committed() const { return committed_; }
  void commit();

 private:
  std::string root_;
  std::string temp_path_;
  std::string final_path_;
  bool committed_ = false;
};

// "step-00000100" for step 100 (at least 8 digits; CheckpointError for a negative step).
std::string checkpoint_name(int64_t step);
// The step of a checkpoint directory path (its last component must be a checkpoint_name).
int64_t checkpoint_step(const std::string& dir);
// Paths of the committed checkpoint directories in `root`, oldest step first; `.tmp-*`
// leftovers, files and other names are ignored. A missing root has none.
std::vector<std::string> list_checkpoints(const std::string& root);
std::optional<std::string> latest_checkpoint(const std::string& root);
// `path` itself when it holds a config.json (a checkpoint or model directory), else the newest
// complete checkpoint of the run directory `path` (trainer_state.h); CheckpointError when it is
// neither.
std::string resolve_model_directory(const std::string& path);
// Removes all but the newest `keep_last` checkpoints (keep_last <= 0 keeps all), each first renamed
// to `.tmp-delete-<name>-<pid>` so that a crash mid-way never leaves a partial `step-*`. Of the
// `.tmp-*-<pid>` directories (every staging name ends in its process's pid) it removes this
// process's deletions and those of processes that have ended (a crashed attempt); this process's
// other ones may be in use and a live process's may be its write in progress, so they stay, as
// does a dead process's whose pid a new process has taken, until a later prune. The trainer prunes
// only while it holds the run directory's lock (run_lock.h). Entries of any other name are left
// alone.
void prune_checkpoints(const std::string& root, int64_t keep_last);

// Replaces `path` with `text` durably (temporary file + fsync + rename + fsync of the directory).
void write_text_file_durable(const std::string& path, const std::string& text);
// The whole file; CheckpointError naming it if it cannot be read.
std::string read_text_file(const std::string& path);

}  // namespace loom::checkpoint
