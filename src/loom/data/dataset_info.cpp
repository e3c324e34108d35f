// Reading dataset_info.json: an entry's file, format and names; LLaMA-Factory's keys Loom cannot
// honour are refused by name.
#include "loom/data/dataset_info.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "loom/util/errors.h"
#include "loom/util/spelling.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// An entry's keys, as LLaMA-Factory defines them.
const std::set<std::string> kEntryKeys = {
    "file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url",  "cloud_file_name", "formatting",
    "ranking",   "subset",     "split",      "folder",     "num_samples", "columns",         "tags"};

// columns and tags: the FieldNames member each sets; "" for one that supervised fine-tuning
// cannot use (preference and KTO columns).
const std::map<std::string, std::string> kColumns = {
    {"prompt", "prompt"},     {"query", "query"},          {"response", "response"}, {"history", "history"},
    {"messages", "messages"}, {"system", "system_prompt"}, {"tools", "tools"},       {"images", "images"},
    {"videos", "videos"},     {"audios", "audios"},        {"chosen", ""},           {"rejected", ""},
    {"kto_tag", ""}};
const std::map<std::string, std::string> kTags = {
    {"role_tag", "role"},           {"content_tag", "content"},         {"user_tag", "user"},
    {"assistant_tag", "assistant"}, {"observation_tag", "observation"}, {"function_tag", "function"},
    {"system_tag", "system"}};

std::vector<std::string> names_of(const json& object) {
  std::vector<std::string> names;
  for (const auto& [name, value] : object.items()) names.push_back(name);
  return names;
}

// DataError for a key of `object` (an entry, or its columns or tags) that LLaMA-Factory does not define.
template <class Map>
void check_keys(const json& object, const Map& known, const std::string& where) {
  std::vector<std::string> valid;  // in the map's (sorted) order
  for (const auto& entry : known) {
    if constexpr (std::is_same_v<Map, std::set<std::string>>)
      valid.push_back(entry);
    else
      valid.push_back(entry.first);
  }
  for (const auto& [key, value] : object.items())
    if (!known.count(key))
      throw DataError(fmt::format("{}: unknown key '{}'{} (valid keys: {})", where, key,
                                  did_you_mean(key, valid), fmt::join(valid, ", ")));
}

}  // namespace

DatasetSpec registry_dataset(const std::string& info_path, const std::string& name) {
  std::ifstream in(info_path);
  if (!in) throw DataError(fmt::format("cannot open the dataset registry {}", info_path));
  json registry;
  try {
    registry = json::parse(in);
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("dataset registry {}: malformed JSON: {}", info_path, e.what()));
  }
  if (!registry.is_object())
    throw DataError(fmt::format("dataset registry {}: must be a JSON object of datasets by name, got {}",
                                info_path, registry.type_name()));
  for (const auto& [entry_name, entry] : registry.items()) {
    const std::string where = fmt::format("dataset registry {} entry '{}'", info_path, entry_name);
    if (!entry.is_object())
      throw DataError(fmt::format("{}: must be a JSON object, got {}", where, entry.type_name()));
    check_keys(entry, kEntryKeys, where);
    for (const auto& [key, known] : {std::pair{"columns", &kColumns}, std::pair{"tags", &kTags}}) {
      const auto section = entry.find(key);
      if (section == entry.end()) continue;
      if (!section->is_object())
        throw DataError(
            fmt::format("{}: {} must be a JSON object, got {}", where, key, section->type_name()));
      check_keys(*section, *known, fmt::format("{} {}", where, key));
      for (const auto& [field, value] : section->items())
        if (!value.is_string() || value.get_ref<const std::string&>().empty())
          throw DataError(fmt::format("{}: {}.{} must be a non-empty string", where, key, field));
    }
  }

  const auto found = registry.find(name);
  if (found == registry.end())
    throw DataError(fmt::format("dataset registry {} holds no dataset '{}'{}", info_path, name,
                                did_you_mean(name, names_of(registry))));
  const json& entry = *found;
  const std::string where = fmt::format("dataset registry {} entry '{}'", info_path, name);
  auto text = [&](const char* key) -> std::string {
    const auto value = entry.find(key);
    if (value == entry.end() || value->is_null()) return "";
    if (!value->is_string()) throw DataError(fmt::format("{}: {} must be a string", where, key));
    return value->get<std::string>();
  };
  for (const char* hub : {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"})
    if (!text(hub).empty())
      throw DataError(
          fmt::format("{}: {} '{}': LLaMA-Factory loads it from there; Loom reads local files only "
                      "(download it and give its file_name without {})",
                      where, hub, text(hub), hub));
  const std::string file = text("file_name");
  if (file.empty()) throw DataError(fmt::format("{}: no file_name", where));
  if (const auto ranking = entry.find("ranking"); ranking != entry.end() && ranking->is_boolean() && *ranking)
    throw DataError(fmt::format(
        "{}: ranking: true is preference data, which supervised fine-tuning does not train on", where));
  if (const auto samples = entry.find("num_samples"); samples != entry.end() && !samples->is_null())
    throw DataError(
        fmt::format("{}: num_samples is not supported; the dataset's weight in data.datasets sets its "
                    "share of the mix",
                    where));
  for (const char* hub_only : {"subset", "folder"})
    if (!text(hub_only).empty())
      throw DataError(fmt::format("{}: {} applies to hub datasets; a local file has none", where, hub_only));
  if (const std::string split = text("split"); !split.empty() && split != "train")
    throw DataError(fmt::format("{}: split '{}': a local file holds one split, train", where, split));

  DatasetSpec spec;
  const fs::path dir = fs::path(info_path).parent_path();
  spec.path = (dir / file).string();
  spec.root = dir.empty() ? std::string(".") : dir.string();
  if (fs::is_directory(spec.path))
    throw DataError(
        fmt::format("{}: file_name {} is a folder; Loom reads one JSON or JSON lines file per dataset", where,
                    spec.path));
  const std::string extension = fs::path(file).extension().string();
  if (extension != ".json" && extension != ".jsonl")
    throw DataError(
        fmt::format("{}: file_name {}: Loom reads JSON (.json) and JSON lines (.jsonl) files", where, file));
  const std::string formatting = entry.contains("formatting") ? text("formatting") : "alpaca";
  if (formatting == "alpaca")
    spec.format = DatasetFormat::alpaca;
  else if (formatting == "sharegpt")
    spec.format = DatasetFormat::sharegpt;
  else if (formatting == "openai")
    spec.format = DatasetFormat::messages;
  else
    throw DataError(
        fmt::format("{}: formatting '{}' is not one of alpaca, sharegpt, openai", where, formatting));
  spec.fields = field_names(spec.format);
  std::map<std::string, std::string> names;
  for (const auto& [key, known] : {std::pair{"columns", &kColumns}, std::pair{"tags", &kTags}}) {
    const auto section = entry.find(key);
    if (section == entry.end()) continue;
    for (const auto& [field, value] : section->items()) {
      const std::string& member = known->at(field);
      if (member.empty())
        throw DataError(
            fmt::format("{}: columns.{} is preference or KTO data, which supervised fine-tuning does "
                        "not train on",
                        where, field));
      names[member] = value.get<std::string>();
    }
  }
  set_field_names(spec.fields, names, where);
  return spec;
}

}  // namespace loom::data
