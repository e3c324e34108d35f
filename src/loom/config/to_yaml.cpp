// JobConfig -> YAML text with every key its sections declare, readable and exact: parse_config reads it
// back to an equal config.
#include <fmt/format.h>

#include "loom/config/config.h"
#include "loom/config/yaml_tree.h"

namespace loom::config {
namespace {

// A string as YAML: bare when it plainly reads back as the same text, else double-quoted (JSON escaping
// is valid YAML).
std::string yaml_string(const std::string& s) {
  bool bare = !s.empty() && s != "null" && s != "Null" && s != "NULL" && s != "~";
  for (size_t i = 0; bare && i < s.size(); ++i) {
    const char c = s[i];
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    bare = word || (i > 0 && (c == '.' || c == '/' || c == '-'));
  }
  return bare ? s : nlohmann::json(s).dump();
}

// A double that reads back as exactly the same double, and as a float: 1 -> 1.0, 1e-08 stays.
std::string yaml_double(double value) {
  std::string text = fmt::format("{}", value);
  if (looks_like_integer(text)) text += ".0";
  return text;
}

// JSON in YAML flow form with spaced separators; strings stay quoted so they read back as strings.
std::string flow_json(const nlohmann::json& value) {
  std::string out;
  if (value.is_array()) {
    for (const auto& item : value) out += (out.empty() ? "" : ", ") + flow_json(item);
    return "[" + out + "]";
  }
  if (value.is_object()) {
    for (const auto& [key, item] : value.items())
      out += (out.empty() ? "" : ", ") + nlohmann::json(key).dump() + ": " + flow_json(item);
    return "{" + out + "}";
  }
  return value.dump();
}

template <class S>
void write_keys(std::string& out, const S& section, int indent, std::string first = "");

// A JSON object as an indented block mapping; nested non-empty objects nest as blocks too.
void emit_object(std::string& out, const nlohmann::json& object, int indent) {
  for (const auto& [key, item] : object.items()) {
    out += fmt::format("{:{}}{}:", "", indent, yaml_string(key));
    if (item.is_object() && !item.empty()) {
      out += "\n";
      emit_object(out, item, indent + 2);
    } else {
      out += " " + flow_json(item) + "\n";
    }
  }
}

// Writes the keys S declares, one line each (nested sections and lists of them as blocks), at
// `indent` spaces; `first` begins the first line instead (the "- " of a list entry). A data key is
// written only for the datasets that read it.
template <class S>
class KeyWriter {
 public:
  KeyWriter(std::string& out, const S& section, int indent, std::string first)
      : out_(out), section_(section), indent_(indent), first_(std::move(first)) {}

  template <class T, class... A>
  void operator()(const char* name, T S::*field, const A&... attributes) {
    if constexpr ((std::is_same_v<A, ReadBy> || ...))
      if (!section_.reads(*key::find_attribute<ReadBy>(attributes...))) return;
    const T& value = section_.*field;
    if constexpr (std::is_same_v<T, std::optional<std::string>>)
      if (!value) return;  // not given: left out, as it was
    begin(name);
    if constexpr (std::is_same_v<T, std::optional<std::string>>) {
      out_ += " " + yaml_string(*value) + "\n";
    } else if constexpr (key::is_section<T>) {
      out_ += "\n";
      write_keys(out_, value, indent_ + 2);
    } else if constexpr (key::is_section_list<T>) {
      if (value.empty()) {
        out_ += " []\n";
        return;
      }
      out_ += "\n";
      for (const auto& entry : value)
        write_keys(out_, entry, indent_ + 4, fmt::format("{:{}}- ", "", indent_ + 2));
    } else {
      out_ += " " + scalar(value, attributes...) + "\n";
    }
  }

  // A path, or the fields inline as a block mapping.
  template <class... A>
  void operator()(const char* name, const key::PathOrMapping<S>& field, const A&... attributes) {
    if constexpr ((std::is_same_v<A, ReadBy> || ...))
      if (!section_.reads(*key::find_attribute<ReadBy>(attributes...))) return;
    const std::string& path = section_.*(field.path);
    const nlohmann::json& mapping = section_.*(field.mapping);
    if (path.empty() && mapping.is_null()) return;  // neither given: left out, as it was
    begin(name);
    if (!path.empty()) {
      out_ += " " + yaml_string(path) + "\n";
    } else if (mapping.is_object() && !mapping.empty()) {
      out_ += "\n";
      emit_object(out_, mapping, indent_ + 2);
    } else {
      out_ += " " + flow_json(mapping) + "\n";
    }
  }

 private:
  void begin(const char* name) {
    out_ += first_.empty() ? fmt::format("{:{}}", "", indent_) : first_;
    out_ += std::string(name) + ":";
    first_.clear();
  }

  template <class... A>
  static std::string scalar(int64_t value, const A&...) {
    if constexpr ((std::is_same_v<A, key::IntegerOrAuto> || ...))
      if (value == 0) return "auto";
    return std::to_string(value);
  }
  template <class... A>
  static std::string scalar(double value, const A&...) {
    return yaml_double(value);
  }
  template <class... A>
  static std::string scalar(bool value, const A&...) {
    return value ? "true" : "false";
  }
  template <class... A>
  static std::string scalar(const std::string& value, const A&...) {
    return yaml_string(value);
  }
  template <class... A>
  static std::string scalar(const std::vector<std::string>& items, const A&...) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : ", ") + yaml_string(item);
    return "[" + out + "]";
  }
  template <class... A>
  static std::string scalar(const std::map<std::string, std::vector<int64_t>>& entries, const A&...) {
    std::string out;
    for (const auto& [name, numbers] : entries) {
      std::string list;
      for (int64_t n : numbers) list += (list.empty() ? "" : ", ") + std::to_string(n);
      out += fmt::format("{}{}: [{}]", out.empty() ? "" : ", ", yaml_string(name), list);
    }
    return "{" + out + "}";
  }
  template <class... A>
  static std::string scalar(const std::map<std::string, std::string>& entries, const A&...) {
    std::string out;
    for (const auto& [name, value] : entries)
      out += fmt::format("{}{}: {}", out.empty() ? "" : ", ", yaml_string(name), yaml_string(value));
    return "{" + out + "}";
  }

  std::string& out_;
  const S& section_;
  int indent_;
  std::string first_;
};

template <class S>
void write_keys(std::string& out, const S& section, int indent, std::string first) {
  KeyWriter<S> writer(out, section, indent, std::move(first));
  S::keys(writer);
}

}  // namespace

std::string to_yaml(const JobConfig& config) {
  // The model keys a task reads follow training.task, as parse_config reads them.
  JobConfig job = config;
  job.model.task = job.training.task;
  std::string out;
  write_keys(out, job, 0);
  return out;
}

}  // namespace loom::config
