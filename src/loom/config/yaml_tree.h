// A YAML document as plain values that --set overrides can edit, each value remembering where it came
// from (the file or the --set), plus the typed readers that turn values into config fields.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace loom::config {

struct YamlValue {
  enum class Kind { Null, Scalar, Sequence, Mapping };
  Kind kind = Kind::Null;
  std::string scalar;            // Scalar: the text
  bool plain = true;             // Scalar: false when quoted or tagged !!str, i.e. always a string
  std::vector<YamlValue> items;  // Sequence
  std::vector<std::pair<std::string, YamlValue>> entries;  // Mapping, in file order, keys unique
  std::string source;                                      // the file name, or `--set key=value`

  // The entry under `key`, or nullptr.
  const YamlValue* find(const std::string& key) const;
  YamlValue* find(const std::string& key);
};

// Parses one YAML document (empty text is Null). `key_prefix` names where the text sits, for
// messages about duplicate keys. Throws ConfigError "<source>: ...".
YamlValue parse_yaml(const std::string& text, const std::string& source, const std::string& key_prefix = "");

// Applies `key=value` (dotted key, value as a YAML scalar, flow sequence or mapping) to `root`,
// creating missing mappings on the way. Throws ConfigError "--set key=value: ...".
void apply_override(YamlValue& root, const std::string& assignment);

// How a value reads in a message: 'ten', null, a sequence, a mapping.
std::string describe(const YamlValue& value);

// "<source>: <key>", or just the source when it is `--set <key>=...`.
std::string locate(const std::string& source, const std::string& key);

// Throws ConfigError "<locate(source, key)>: <what>".
[[noreturn]] void fail_at(const YamlValue& value, const std::string& key, const std::string& what);

// Typed reading of one value at dotted `key`; a mismatch throws "expected ..., got ...".
int64_t as_integer(const YamlValue& value, const std::string& key);     // plain YAML ints only
double as_double(const YamlValue& value, const std::string& key);       // ints or floats, finite
bool as_bool(const YamlValue& value, const std::string& key);           // true | false
std::string as_string(const YamlValue& value, const std::string& key);  // any scalar, not null
std::vector<std::string> as_string_list(const YamlValue& value, const std::string& key);

// YAML -> JSON: plain ints stay ints, floats floats, true/false bools, null null, quoted text strings,
// sequences arrays, mappings objects.
nlohmann::json to_json(const YamlValue& value, const std::string& key);

// Whether a plain scalar reads as a YAML integer / float (1e3 is a float, not an integer).
bool looks_like_integer(const std::string& text);
bool looks_like_float(const std::string& text);

}  // namespace loom::config
