// Reading a model's config.json fields: each typed, required or with a fallback, and every error a
// one-line ConfigError naming the file and the dotted key ("config.json: vision_config.depth: ...").
// Shared by every family's config parser.
#pragma once
#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/util/errors.h"

namespace loom::models {

// The JSON object of a config file; ConfigError naming the file when it cannot be opened or is not
// JSON.
nlohmann::json read_config_file(const std::string& path);

class FieldReader {
 public:
  // `object`, read from `source`; `prefix` ("text_config.") goes before every key in messages.
  FieldReader(const nlohmann::json& object, std::string source, std::string prefix = "");

  // Present and not null.
  bool has(const char* key) const;
  const nlohmann::json& raw(const char* key) const { return object_[key]; }

  // Without a fallback, a missing field is "missing required field".
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) const;
  double number(const char* key, std::optional<double> fallback = std::nullopt) const;
  bool boolean(const char* key, std::optional<bool> fallback = std::nullopt) const;
  std::string string(const char* key, std::optional<std::string> fallback = std::nullopt) const;
  std::vector<int64_t> integers(const char* key,
                                std::optional<std::vector<int64_t>> fallback = std::nullopt) const;
  std::vector<bool> booleans(const char* key) const;
  // A list of numbers, or nothing when the field is absent.
  std::optional<std::vector<double>> numbers(const char* key) const;
  // A list of exactly N integers.
  template <size_t N>
  std::array<int64_t, N> integer_array(const char* key, std::array<int64_t, N> fallback) const {
    if (!has(key)) return fallback;
    const nlohmann::json& v = object_[key];
    std::array<int64_t, N> out{};
    for (size_t i = 0; i < N; ++i) {
      if (!v.is_array() || v.size() != N || !v[i].is_number_integer())
        throw wrong_type(key, "a list of " + std::to_string(N) + " integers", v);
      out[i] = v[i].get<int64_t>();
    }
    return out;
  }

  // "<source>: <prefix><key>: <what>".
  ConfigError error(const char* key, const std::string& what) const;

 private:
  const nlohmann::json& required(const char* key) const;
  ConfigError wrong_type(const char* key, const std::string& expected, const nlohmann::json& value) const;

  const nlohmann::json& object_;
  std::string source_, prefix_;
};

}  // namespace loom::models
