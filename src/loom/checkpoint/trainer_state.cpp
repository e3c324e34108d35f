#include "loom/checkpoint/trainer_state.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/util/errors.h"

namespace loom::checkpoint {

namespace fs = std::filesystem;

std::string trainer_state_json(const TrainerState& state) {
  const nlohmann::json json = {{"step", state.step},
                               {"global_batch_size", state.global_batch_size},
                               {"micro_batch_size", state.micro_batch_size},
                               {"data_position", state.data_position()},
                               {"seed", state.seed},
                               {"skipped_nonfinite_steps", state.skipped_nonfinite_steps}};
  return json.dump(2) + "\n";
}

TrainerState read_trainer_state(const std::string& dir) {
  const std::string path = (fs::path(dir) / kTrainerStateFile).string();
  const std::string text = read_text_file(path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw CheckpointError(
        fmt::format("{}: not valid JSON ({} bytes; a truncated or damaged file)", path, text.size()));
  }
  if (!json.is_object()) throw CheckpointError(fmt::format("{}: expected a JSON object", path));
  auto field = [&](const char* key, bool required) -> std::optional<int64_t> {
    if (!json.contains(key)) {
      if (required) throw CheckpointError(fmt::format("{}: missing field '{}'", path, key));
      return std::nullopt;
    }
    const nlohmann::json& value = json[key];
    if (!value.is_number_integer() || value.get<int64_t>() < 0)
      throw CheckpointError(
          fmt::format("{}: field '{}' must be an integer >= 0, got {}", path, key, value.dump()));
    return value.get<int64_t>();
  };
  TrainerState state;
  state.step = *field("step", true);
  state.global_batch_size = *field("global_batch_size", true);
  state.micro_batch_size = field("micro_batch_size", false).value_or(0);
  state.seed = field("seed", false).value_or(0);
  state.skipped_nonfinite_steps = field("skipped_nonfinite_steps", false).value_or(0);
  if (const auto position = field("data_position", false); position && *position != state.data_position())
    throw CheckpointError(fmt::format("{}: data_position {} is not step {} x global_batch_size {}", path,
                                      *position, state.step, state.global_batch_size));
  int64_t named = 0;
  try {
    named = checkpoint_step(dir);
  } catch (const CheckpointError&) {
    return state;  // a directory of another name (training.resume: DIR) has no step in its name
  }
  if (named != state.step)
    throw CheckpointError(fmt::format("{}: step {} disagrees with the directory's name {} (step {})", path,
                                      state.step, fs::path(dir).filename().string(), named));
  return state;
}

std::optional<std::string> incomplete_checkpoint(const std::string& dir) {
  for (const char* name : {"config.json", "model.safetensors", "optimizer.safetensors", kTrainerStateFile})
    if (!fs::is_regular_file(fs::path(dir) / name)) return fmt::format("{} is missing", name);
  try {
    SafetensorsReader((fs::path(dir) / "model.safetensors").string());
    SafetensorsReader((fs::path(dir) / "optimizer.safetensors").string());
    read_trainer_state(dir);
  } catch (const CheckpointError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

std::optional<std::string> latest_complete_checkpoint(const std::string& root) {
  const std::vector<std::string> all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const auto reason = incomplete_checkpoint(*it);
    if (!reason) return *it;
    spdlog::warn("passing over checkpoint {}, which is incomplete: {}", *it, *reason);
  }
  return std::nullopt;
}

}  // namespace loom::checkpoint
