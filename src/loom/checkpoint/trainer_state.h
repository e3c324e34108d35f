// A checkpoint's trainer_state.json (the step, the batch sizes its data position follows from, the
// seed and the non-finite steps skipped so far), and which of a run's checkpoints are complete enough
// to resume from.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace loom::checkpoint {

struct TrainerState {
  int64_t step = 0;
  int64_t global_batch_size = 0, micro_batch_size = 0;
  int64_t seed = 0;
  int64_t skipped_nonfinite_steps = 0;  // absent in checkpoints written before it was kept: 0
  int64_t data_position() const { return step * global_batch_size; }
};

constexpr const char* kTrainerStateFile = "trainer_state.json";

// The JSON text a checkpoint holds.
std::string trainer_state_json(const TrainerState& state);
// Reads `<dir>/trainer_state.json`. CheckpointError naming the file and the field for text that is not
// JSON (a truncated file), a missing or mistyped field, a negative value, a data_position that does not
// follow from step x global_batch_size, or (when `dir` is named step-N) a step other than N.
TrainerState read_trainer_state(const std::string& dir);

// Why `dir` cannot be resumed from (a missing, truncated or inconsistent file, named), or nothing when
// it holds every file a Loom checkpoint has: config.json, model.safetensors, optimizer.safetensors and
// a trainer_state.json that read_trainer_state accepts.
std::optional<std::string> incomplete_checkpoint(const std::string& dir);

// The newest checkpoint of the run directory `root` that incomplete_checkpoint accepts; each newer
// one passed over is logged as a warning with its reason.
std::optional<std::string> latest_complete_checkpoint(const std::string& root);

}  // namespace loom::checkpoint
