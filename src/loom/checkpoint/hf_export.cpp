#include "loom/checkpoint/hf_export.h"

#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/util/errors.h"

namespace loom::checkpoint {

namespace fs = std::filesystem;

std::string hf_torch_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      throw CheckpointError(fmt::format("no torch_dtype name for {}", c10::toString(dtype)));
  }
}

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {{"", 1.0},
                                                      {"B", 1.0},
                                                      {"KB", 1e3},
                                                      {"MB", 1e6},
                                                      {"GB", 1e9},
                                                      {"TB", 1e12},
                                                      {"KIB", 1024.0},
                                                      {"MIB", 1024.0 * 1024},
                                                      {"GIB", 1073741824.0},
                                                      {"TIB", 1099511627776.0}};
  const auto it = units.find(unit);
  double value = 0;
  try {
    size_t parsed = 0;
    value = digits > 0 ? std::stod(text.substr(0, digits), &parsed) : 0;
    if (parsed != digits) value = 0;
  } catch (const std::exception&) {
    value = 0;
  }
  if (it == units.end() || value <= 0)
    throw ConfigError(
        fmt::format("{}: '{}' is not a size (such as 5GB, 500MB, 2GiB or a byte count)", what, text));
  const double bytes = value * it->second;
  if (bytes < 1) throw ConfigError(fmt::format("{}: '{}' is less than one byte", what, text));
  return static_cast<int64_t>(bytes);
}

namespace {

// Which tensors (by position) go into which shard: in order, a new shard whenever the next tensor
// would overflow the current one.
std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& bytes, int64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!shards.back().empty() && in_shard + bytes[i] > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes[i];
  }
  return shards;
}

std::string shard_name(size_t shard, size_t shards) {
  return shards == 1 ? "model.safetensors"
                     : fmt::format("model-{:05d}-of-{:05d}.safetensors", shard + 1, shards);
}

// Writes each shard from the tensors `load` gives for its positions (one shard in memory at a time),
// then the index when there are several.
std::vector<std::string> write_shards(const std::string& dir, const std::vector<std::string>& names,
                                      const std::vector<int64_t>& bytes, int64_t max_shard_bytes,
                                      const std::map<std::string, std::string>& metadata,
                                      const std::function<at::Tensor(size_t)>& load) {
  const auto shards = plan_shards(bytes, max_shard_bytes);
  std::vector<std::string> files;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    files.push_back(shard_name(s, shards.size()));
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (size_t i : shards[s]) {
      tensors.emplace_back(names[i], load(i));
      weight_map[names[i]] = files.back();
      total += bytes[i];
    }
    save_safetensors(dir + "/" + files.back(), tensors, metadata);
  }
  if (shards.size() == 1) return files;
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text_file_durable(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  files.push_back("model.safetensors.index.json");
  return files;
}

}  // namespace

std::vector<std::string> save_sharded_safetensors(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    int64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> names;
  std::vector<int64_t> bytes;
  for (const auto& [name, t] : tensors) {
    names.push_back(name);
    bytes.push_back(static_cast<int64_t>(t.nbytes()));
  }
  return write_shards(dir, names, bytes, max_shard_bytes, metadata,
                      [&tensors](size_t i) { return tensors[i].second; });
}

namespace {

// What a checkpoint holds that a model directory does not: the weights (written anew) and the
// training state.
bool left_behind(const std::string& name) {
  static const std::set<std::string> names = {"model.safetensors", "model.safetensors.index.json",
                                              "optimizer.safetensors", "trainer_state.json", "job.yaml"};
  if (names.count(name) > 0) return true;
  return name.rfind("model-", 0) == 0 && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors";
}

}  // namespace

int64_t export_hf_directory(const std::string& source, const std::string& out, const ExportOptions& options) {
  if (!fs::is_regular_file(fs::path(source) / "config.json"))
    throw CheckpointError(fmt::format("{}: not a model directory (no config.json)", source));
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)))
    throw CheckpointError(
        fmt::format("{}: exists and is not an empty directory; export writes a new one", out));
  const WeightSource weights(source);
  const std::vector<std::string> names = weights.names();
  // Floating-point weights in the asked dtype; the rest (integer buffers) as stored.
  auto target_dtype = [&](const std::string& name) {
    const at::ScalarType stored = weights.dtype(name);
    return options.dtype && at::isFloatingType(stored) ? *options.dtype : stored;
  };
  std::vector<int64_t> bytes;
  std::optional<at::ScalarType> floating;
  for (const std::string& name : names) {
    int64_t numel = 1;
    for (int64_t d : weights.shape(name)) numel *= d;
    bytes.push_back(numel * static_cast<int64_t>(c10::elementSize(target_dtype(name))));
    if (at::isFloatingType(target_dtype(name))) floating = target_dtype(name);
  }
  const fs::path target = fs::absolute(out).lexically_normal();
  fs::create_directories(target.parent_path());
  StagedDirectory staged(target.parent_path().string(), target.filename().string());
  write_shards(staged.path(), names, bytes, options.max_shard_bytes, {{"format", "pt"}},
               [&](size_t i) { return weights.load(names[i]).to(target_dtype(names[i])); });
  for (const auto& entry : fs::directory_iterator(source)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || left_behind(name)) continue;
    if (name == "config.json") {
      std::ifstream in(entry.path());
      nlohmann::ordered_json config;
      try {
        config = nlohmann::ordered_json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        throw CheckpointError(fmt::format("{}: not valid JSON ({})", entry.path().string(), e.what()));
      }
      if (floating) config["torch_dtype"] = hf_torch_dtype(*floating);
      write_text_file_durable(staged.path() + "/config.json", config.dump(2) + "\n");
      continue;
    }
    fs::copy_file(entry.path(), fs::path(staged.path()) / name);
  }
  staged.commit();
  return static_cast<int64_t>(names.size());
}

}  // namespace loom::checkpoint
