#include "loom/models/field_reader.h"

#include <fmt/format.h>

#include <fstream>

namespace loom::models {

using json = nlohmann::json;

json read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the model config", path));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
}

FieldReader::FieldReader(const json& object, std::string source, std::string prefix)
    : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

bool FieldReader::has(const char* key) const { return object_.contains(key) && !object_[key].is_null(); }

const json& FieldReader::required(const char* key) const {
  if (!has(key)) throw error(key, "missing required field");
  return object_[key];
}

ConfigError FieldReader::error(const char* key, const std::string& what) const {
  return ConfigError(fmt::format("{}: {}{}: {}", source_, prefix_, key, what));
}

ConfigError FieldReader::wrong_type(const char* key, const std::string& expected, const json& value) const {
  return error(key, fmt::format("expected {}, got {}", expected, value.dump()));
}

int64_t FieldReader::integer(const char* key, std::optional<int64_t> fallback) const {
  if (!has(key) && fallback) return *fallback;
  const json& v = required(key);
  if (!v.is_number_integer()) throw wrong_type(key, "an integer", v);
  return v.get<int64_t>();
}

double FieldReader::number(const char* key, std::optional<double> fallback) const {
  if (!has(key) && fallback) return *fallback;
  const json& v = required(key);
  if (!v.is_number()) throw wrong_type(key, "a number", v);
  return v.get<double>();
}

bool FieldReader::boolean(const char* key, std::optional<bool> fallback) const {
  if (!has(key) && fallback) return *fallback;
  const json& v = required(key);
  if (!v.is_boolean()) throw wrong_type(key, "true or false", v);
  return v.get<bool>();
}

std::string FieldReader::string(const char* key, std::optional<std::string> fallback) const {
  if (!has(key) && fallback) return *fallback;
  const json& v = required(key);
  if (!v.is_string()) throw wrong_type(key, "a string", v);
  return v.get<std::string>();
}

std::vector<int64_t> FieldReader::integers(const char* key,
                                           std::optional<std::vector<int64_t>> fallback) const {
  if (!has(key) && fallback) return *fallback;
  const json& v = required(key);
  if (!v.is_array()) throw wrong_type(key, "a list of integers", v);
  std::vector<int64_t> out;
  for (const json& e : v) {
    if (!e.is_number_integer()) throw wrong_type(key, "a list of integers", v);
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::vector<bool> FieldReader::booleans(const char* key) const {
  const json& v = required(key);
  if (!v.is_array()) throw wrong_type(key, "a list of booleans", v);
  std::vector<bool> out;
  for (const json& e : v) {
    if (!e.is_boolean()) throw wrong_type(key, "a list of booleans", v);
    out.push_back(e.get<bool>());
  }
  return out;
}

std::optional<std::vector<double>> FieldReader::numbers(const char* key) const {
  if (!has(key)) return std::nullopt;
  const json& v = object_[key];
  if (!v.is_array()) throw wrong_type(key, "a list of numbers", v);
  std::vector<double> out;
  for (const json& e : v) {
    if (!e.is_number()) throw wrong_type(key, "a list of numbers", v);
    out.push_back(e.get<double>());
  }
  return out;
}

}  // namespace loom::models
