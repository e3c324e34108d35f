#include "loom/models/wan/names.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/checkpoint/safetensors.h"
#include "loom/models/weights.h"
#include "loom/parallel/tensor.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

namespace fs = std::filesystem;

// One module (or parameter table) under both layouts' names. A module's parameters are
// `<name>.weight` and `<name>.bias`; a table is a parameter itself.
struct Rename {
  const char* diffusers;
  const char* wan;
  bool table = false;
};

const std::vector<Rename>& top_level() {
  static const std::vector<Rename> renames = {
      {"patch_embedding", "patch_embedding"},
      {"condition_embedder.text_embedder.linear_1", "text_embedding.0"},
      {"condition_embedder.text_embedder.linear_2", "text_embedding.2"},
      {"condition_embedder.time_embedder.linear_1", "time_embedding.0"},
      {"condition_embedder.time_embedder.linear_2", "time_embedding.2"},
      {"condition_embedder.time_proj", "time_projection.1"},
      {"scale_shift_table", "head.modulation", true},
      {"proj_out", "head.head"},
  };
  return renames;
}

// Inside blocks.{i}.
const std::vector<Rename>& in_block() {
  static const std::vector<Rename> renames = {
      {"scale_shift_table", "modulation", true},
      {"attn1.to_q", "self_attn.q"},
      {"attn1.to_k", "self_attn.k"},
      {"attn1.to_v", "self_attn.v"},
      {"attn1.to_out.0", "self_attn.o"},
      {"attn1.norm_q", "self_attn.norm_q"},
      {"attn1.norm_k", "self_attn.norm_k"},
      {"norm2", "norm3"},
      {"attn2.to_q", "cross_attn.q"},
      {"attn2.to_k", "cross_attn.k"},
      {"attn2.to_v", "cross_attn.v"},
      {"attn2.to_out.0", "cross_attn.o"},
      {"attn2.norm_q", "cross_attn.norm_q"},
      {"attn2.norm_k", "cross_attn.norm_k"},
      {"ffn.net.0.proj", "ffn.0"},
      {"ffn.net.2", "ffn.2"},
  };
  return renames;
}

// `name` from one layout to the other; empty when it has no counterpart.
std::string translate(const std::string& name, bool from_diffusers) {
  std::string prefix, rest = name;
  const std::vector<Rename>* renames = &top_level();
  if (name.rfind("blocks.", 0) == 0) {
    size_t end = 7;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == 7 || end >= name.size() || name[end] != '.') return "";
    prefix = name.substr(0, end + 1);
    rest = name.substr(end + 1);
    renames = &in_block();
  }
  for (const Rename& r : *renames) {
    const std::string from = from_diffusers ? r.diffusers : r.wan;
    const std::string to = from_diffusers ? r.wan : r.diffusers;
    if (r.table) {
      if (rest == from) return prefix + to;
      continue;
    }
    if (rest.size() > from.size() && rest.compare(0, from.size(), from) == 0 && rest[from.size()] == '.') {
      const std::string leaf = rest.substr(from.size() + 1);
      if (leaf == "weight" || leaf == "bias") return prefix + to + "." + leaf;
    }
  }
  return "";
}

// The safetensors files of a model directory and which holds each tensor.
class WeightFiles {
 public:
  explicit WeightFiles(const std::string& dir) {
    for (const char* base : {"model", "diffusion_pytorch_model"}) {
      const fs::path single = fs::path(dir) / (std::string(base) + ".safetensors");
      const fs::path index = fs::path(dir) / (std::string(base) + ".safetensors.index.json");
      if (fs::is_regular_file(single)) {
        readers_.emplace_back(single.string());
        for (const auto& name : readers_[0].names()) reader_of_[name] = 0;
        return;
      }
      if (fs::is_regular_file(index)) {
        read_index(index);
        return;
      }
    }
    throw CheckpointError(fmt::format(
        "{}: no model.safetensors, diffusion_pytorch_model.safetensors or .safetensors.index.json of either",
        dir));
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : reader_of_) out.push_back(entry.first);
    return out;
  }
  const checkpoint::SafetensorsReader& reader(const std::string& name) const {
    return readers_[reader_of_.at(name)];
  }

 private:
  void read_index(const fs::path& path) {
    std::ifstream in(path);
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(fmt::format("'{}' is not valid JSON: {}", path.string(), e.what()));
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw CheckpointError(
          fmt::format("'{}' has no object 'weight_map' (tensor name -> shard file)", path.string()));
    std::map<std::string, size_t> shard_index;  // file name -> index into readers_
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string())
        throw CheckpointError(
            fmt::format("'{}': weight_map entry '{}' is not a file name", path.string(), name));
      auto found = shard_index.find(file.get<std::string>());
      if (found == shard_index.end()) {
        const fs::path shard = path.parent_path() / file.get<std::string>();
        if (!fs::is_regular_file(shard))
          throw CheckpointError(fmt::format("'{}' puts tensor '{}' in shard '{}', which does not exist",
                                            path.string(), name, shard.string()));
        readers_.emplace_back(shard.string());
        found = shard_index.emplace(file.get<std::string>(), readers_.size() - 1).first;
      }
      if (!readers_[found->second].contains(name))
        throw CheckpointError(fmt::format("'{}' puts tensor '{}' in shard '{}', which does not hold it",
                                          path.string(), name, readers_[found->second].path()));
      reader_of_[name] = found->second;
    }
  }

  std::vector<checkpoint::SafetensorsReader> readers_;
  std::map<std::string, size_t> reader_of_;
};

}  // namespace

bool is_diffusers_layout(const std::vector<std::string>& names) {
  for (const auto& name : names)
    if (name.rfind("condition_embedder.", 0) == 0) return true;
  return false;
}

std::string wan_name_from_diffusers(const std::string& name) {
  const std::string wan = translate(name, /*from_diffusers=*/true);
  if (wan.empty())
    throw CheckpointError(fmt::format(
        "diffusers tensor '{}' has no counterpart in Wan's text-to-video DiT (an image-to-video or unknown "
        "weight)",
        name));
  return wan;
}

std::string diffusers_name_from_wan(const std::string& name) {
  const std::string diffusers = translate(name, /*from_diffusers=*/false);
  if (diffusers.empty())
    throw CheckpointError(fmt::format("'{}' is not a parameter of Wan's text-to-video DiT", name));
  return diffusers;
}

void load_wan_parameters(WanModel& model, const std::string& model_dir) {
  const WeightFiles files(model_dir);
  const std::vector<std::string> names = files.names();
  const bool diffusers = is_diffusers_layout(names);
  std::map<std::string, std::string> file_name_of;  // Wan name -> the name in the file
  for (const auto& name : names) {
    std::string wan = name;
    if (diffusers) {
      wan = translate(name, /*from_diffusers=*/true);
      if (wan.empty())
        throw CheckpointError(
            fmt::format("{}: tensor '{}' does not belong to Wan's text-to-video DiT (diffusers "
                        "layout; an image-to-video or unknown weight)",
                        files.reader(name).path(), name));
    }
    const auto [it, added] = file_name_of.emplace(wan, name);
    if (!added)
      throw CheckpointError(
          fmt::format("{}: tensors '{}' and '{}' are both Wan's '{}'", model_dir, it->second, name, wan));
  }
  std::set<std::string> unused(names.begin(), names.end());
  at::NoGradGuard no_grad;
  const auto layouts = parallel::shard_layouts(model);  // whole tensors in the files, slices under tp
  for (auto& [name, param] : named_parameters(model)) {
    const auto layout = layouts.find(name);
    const std::vector<int64_t> whole =
        layout == layouts.end() ? param.sizes().vec() : layout->second.whole_shape(param.sizes());
    const auto found = file_name_of.find(name);
    if (found == file_name_of.end())
      throw CheckpointError(fmt::format("{}: tensor '{}' is missing (the model has it with shape {})",
                                        model_dir, diffusers ? diffusers_name_from_wan(name) : name,
                                        fmt::join(whole, "x")));
    const std::string& stored = found->second;
    const checkpoint::SafetensorsReader& reader = files.reader(stored);
    if (reader.shape(stored) != whole)
      throw CheckpointError(fmt::format("{}: tensor '{}' has shape [{}], the model expects [{}]",
                                        reader.path(), stored, fmt::join(reader.shape(stored), ", "),
                                        fmt::join(whole, ", ")));
    if (!checkpoint::loadable_as(reader.dtype(stored), param.scalar_type()))
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' is stored as {}, which cannot load into the model's {} parameter (a mislabelled "
          "or "
          "foreign tensor)",
          reader.path(), stored, c10::toString(reader.dtype(stored)), c10::toString(param.scalar_type())));
    const at::Tensor values = reader.load(stored);
    param.copy_(layout == layouts.end() ? values : layout->second.slice(values));
    unused.erase(stored);
  }
  if (!unused.empty())
    throw CheckpointError(fmt::format("{}: tensor '{}' does not belong to this model ({} unexpected tensors)",
                                      files.reader(*unused.begin()).path(), *unused.begin(), unused.size()));
  spdlog::info("loaded {} tensors from {} ({} layout)", names.size(), model_dir,
               diffusers ? "diffusers" : "Wan");
}

}  // namespace loom::models
