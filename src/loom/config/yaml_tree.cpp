// YAML text -> YamlValue trees, --set overrides, and typed reading with one-line errors.
#include "loom/config/yaml_tree.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "loom/util/errors.h"

namespace loom::config {
namespace {

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw ConfigError(source + ": " + what);
}

// The most values (scalars, lists and mappings) a job's YAML may expand to, aliases expanded, and the
// deepest nesting: a job has a few hundred values, and aliases of aliases (an "alias bomb") expand
// a few hundred bytes to billions.
constexpr int64_t kMaxYamlValues = 100'000;
constexpr int kMaxYamlDepth = 64;

struct ConvertBudget {
  int64_t values = 0;
};

YamlValue convert(const YAML::Node& node, const std::string& source, const std::string& path,
                  ConvertBudget& budget, int depth) {
  if (++budget.values > kMaxYamlValues)
    fail(source, fmt::format("expands to more than {} values (aliases of aliases?); a job is far smaller",
                             kMaxYamlValues));
  if (depth > kMaxYamlDepth)
    fail(source,
         fmt::format("{}: nested more than {} levels deep", path.empty() ? "document" : path, kMaxYamlDepth));
  YamlValue value;
  value.source = source;
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      value.kind = YamlValue::Kind::Null;
      break;
    case YAML::NodeType::Scalar: {
      value.kind = YamlValue::Kind::Scalar;
      value.scalar = node.Scalar();
      const std::string& tag = node.Tag();
      if (tag == "?") {
        value.plain = true;
      } else if (tag == "!" || tag == "tag:yaml.org,2002:str") {
        value.plain = false;
      } else {
        fail(source, fmt::format("{}: unsupported YAML tag '{}' (write the value without a tag)",
                                 path.empty() ? "document" : path, tag));
      }
      break;
    }
    case YAML::NodeType::Sequence:
      value.kind = YamlValue::Kind::Sequence;
      for (size_t i = 0; i < node.size(); ++i)
        value.items.push_back(convert(node[i], source, fmt::format("{}[{}]", path, i), budget, depth + 1));
      break;
    case YAML::NodeType::Map:
      value.kind = YamlValue::Kind::Mapping;
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!it->first.IsScalar())
          fail(source, fmt::format("{}: a key is not a plain name", path.empty() ? "document" : path));
        const std::string key = it->first.Scalar();
        if (value.find(key)) fail(source, fmt::format("duplicate key '{}'", join_key(path, key)));
        value.entries.emplace_back(key, convert(it->second, source, join_key(path, key), budget, depth + 1));
      }
      break;
  }
  return value;
}

void set_source(YamlValue& value, const std::string& source) {
  value.source = source;
  for (auto& item : value.items) set_source(item, source);
  for (auto& [key, entry] : value.entries) set_source(entry, source);
}

bool all_digits(const std::string& s, size_t begin, size_t end) {
  if (begin >= end) return false;
  for (size_t i = begin; i < end; ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

std::string quoted_note(const YamlValue& value) {
  return value.kind == YamlValue::Kind::Scalar && !value.plain ? " (quoted, so a string)" : "";
}

}  // namespace

const YamlValue* YamlValue::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

YamlValue* YamlValue::find(const std::string& key) {
  for (auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

YamlValue parse_yaml(const std::string& text, const std::string& source, const std::string& key_prefix) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    fail(source,
         fmt::format("invalid YAML at line {}, column {}: {}", e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (documents.size() > 1)
    fail(source, fmt::format("holds {} YAML documents; a job is one document", documents.size()));
  if (documents.empty()) {
    YamlValue null_value;
    null_value.source = source;
    return null_value;
  }
  ConvertBudget budget;
  return convert(documents[0], source, key_prefix, budget, 0);
}

void apply_override(YamlValue& root, const std::string& assignment) {
  const std::string source = "--set " + assignment;
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos)
    fail(source, "expected key=value with a dotted key, e.g. --set training.lr=1e-4");
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);

  std::vector<std::string> path;
  for (size_t begin = 0;;) {
    const size_t dot = key.find('.', begin);
    path.push_back(key.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (path.back().empty()) fail(source, fmt::format("'{}' is not a dotted key like training.lr", key));
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }

  YamlValue value;
  if (text.empty()) {  // `key=` sets the empty string
    value.kind = YamlValue::Kind::Scalar;
    value.plain = false;
  } else {
    value = parse_yaml(text, source, key);
  }
  set_source(value, source);

  YamlValue* node = &root;
  std::string walked;
  for (size_t i = 0; i < path.size(); ++i) {
    if (node->kind == YamlValue::Kind::Null) {
      node->kind = YamlValue::Kind::Mapping;
      node->source = source;
    }
    if (node->kind != YamlValue::Kind::Mapping)
      fail(source,
           fmt::format("'{}' is {}, not a mapping, so it has no key '{}'", walked, describe(*node), path[i]));
    walked = join_key(walked, path[i]);
    YamlValue* next = node->find(path[i]);
    if (i + 1 == path.size()) {
      if (next)
        *next = value;
      else
        node->entries.emplace_back(path[i], value);
      return;
    }
    if (!next) {
      YamlValue mapping;
      mapping.kind = YamlValue::Kind::Mapping;
      mapping.source = source;
      node->entries.emplace_back(path[i], std::move(mapping));
      next = &node->entries.back().second;
    }
    node = next;
  }
}

std::string describe(const YamlValue& value) {
  switch (value.kind) {
    case YamlValue::Kind::Null:
      return "null";
    case YamlValue::Kind::Scalar:
      return "'" + value.scalar + "'";
    case YamlValue::Kind::Sequence:
      return "a sequence";
    case YamlValue::Kind::Mapping:
      return "a mapping";
  }
  return "?";
}

std::string locate(const std::string& source, const std::string& key) {
  // `--set training.steps=x` already names the key.
  const std::string set_prefix = "--set " + key + "=";
  if (source.compare(0, set_prefix.size(), set_prefix) == 0) return source;
  return source + ": " + key;
}

void fail_at(const YamlValue& value, const std::string& key, const std::string& what) {
  throw ConfigError(locate(value.source, key) + ": " + what);
}

bool looks_like_integer(const std::string& s) {
  const size_t begin = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  return all_digits(s, begin, s.size());
}

bool looks_like_float(const std::string& s) {
  size_t i = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  size_t mantissa_digits = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++mantissa_digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    return all_digits(s, i, s.size());
  }
  return i == s.size();
}

int64_t as_integer(const YamlValue& value, const std::string& key) {
  if (value.kind != YamlValue::Kind::Scalar || !value.plain || !looks_like_integer(value.scalar))
    fail_at(value, key, fmt::format("expected an integer, got {}{}", describe(value), quoted_note(value)));
  errno = 0;
  const long long parsed = std::strtoll(value.scalar.c_str(), nullptr, 10);
  if (errno == ERANGE)
    fail_at(value, key, fmt::format("expected an integer, got {} (out of range)", describe(value)));
  return parsed;
}

double as_double(const YamlValue& value, const std::string& key) {
  if (value.kind != YamlValue::Kind::Scalar || !value.plain || !looks_like_float(value.scalar))
    fail_at(value, key, fmt::format("expected a number, got {}{}", describe(value), quoted_note(value)));
  const double parsed = std::strtod(value.scalar.c_str(), nullptr);
  if (!std::isfinite(parsed))
    fail_at(value, key, fmt::format("expected a number, got {} (out of range)", describe(value)));
  return parsed;
}

bool as_bool(const YamlValue& value, const std::string& key) {
  if (value.kind == YamlValue::Kind::Scalar && value.plain) {
    if (value.scalar == "true") return true;
    if (value.scalar == "false") return false;
  }
  fail_at(value, key, fmt::format("expected true or false, got {}{}", describe(value), quoted_note(value)));
}

std::string as_string(const YamlValue& value, const std::string& key) {
  if (value.kind != YamlValue::Kind::Scalar)
    fail_at(value, key, fmt::format("expected a string, got {}", describe(value)));
  return value.scalar;
}

std::vector<std::string> as_string_list(const YamlValue& value, const std::string& key) {
  if (value.kind != YamlValue::Kind::Sequence)
    fail_at(value, key, fmt::format("expected a list of strings such as [a, b], got {}", describe(value)));
  std::vector<std::string> list;
  for (size_t i = 0; i < value.items.size(); ++i)
    list.push_back(as_string(value.items[i], fmt::format("{}[{}]", key, i)));
  return list;
}

nlohmann::json to_json(const YamlValue& value, const std::string& key) {
  switch (value.kind) {
    case YamlValue::Kind::Null:
      return nullptr;
    case YamlValue::Kind::Scalar: {
      const std::string& s = value.scalar;
      if (!value.plain) return s;
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (looks_like_integer(s)) {
        errno = 0;
        const long long as_signed = std::strtoll(s.c_str(), nullptr, 10);
        if (errno != ERANGE) return static_cast<int64_t>(as_signed);
        errno = 0;
        const unsigned long long as_unsigned = std::strtoull(s.c_str(), nullptr, 10);
        if (s[0] != '-' && errno != ERANGE) return static_cast<uint64_t>(as_unsigned);
        fail_at(value, key, fmt::format("integer {} is out of range", describe(value)));
      }
      if (looks_like_float(s)) {
        const double parsed = std::strtod(s.c_str(), nullptr);
        if (!std::isfinite(parsed))
          fail_at(value, key, fmt::format("number {} is out of range", describe(value)));
        return parsed;
      }
      if (s == ".inf" || s == "-.inf" || s == "+.inf" || s == ".nan" || s == ".Inf" || s == ".NaN")
        fail_at(value, key, fmt::format("{} cannot be written in JSON", describe(value)));
      return s;
    }
    case YamlValue::Kind::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (size_t i = 0; i < value.items.size(); ++i)
        array.push_back(to_json(value.items[i], fmt::format("{}[{}]", key, i)));
      return array;
    }
    case YamlValue::Kind::Mapping: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& [k, v] : value.entries) object[k] = to_json(v, join_key(key, k));
      return object;
    }
  }
  return nullptr;
}

}  // namespace loom::config
