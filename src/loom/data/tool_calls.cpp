#include "loom/data/tool_calls.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>

namespace loom::data {
namespace {

using json = nlohmann::ordered_json;

// The system prompt's tool section, word for word as the Hermes-format chat templates write it; {}
// is the descriptions, each on its own line.
constexpr const char* kToolsPrompt =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{}"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}}\n</tool_call>";

// A float as Python's repr writes it: the shortest digits that read back to it, positional for
// decimal exponents -4..15 (with ".0" for whole numbers), else d.ddde+XX.
std::string python_float(double value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string text(buffer, end);  // "-1.2345e-05"
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  const bool negative = text[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i)
    if (text[i] != '.') digits += text[i];
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    return out + fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  if (exponent < 0) return out + "0." + std::string(-exponent - 1, '0') + digits;
  const size_t whole = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= whole) return out + digits + std::string(whole - digits.size(), '0') + ".0";
  return out + digits.substr(0, whole) + "." + digits.substr(whole);
}

void write_python_json(const json& value, std::string& out) {
  switch (value.type()) {
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        out += json(key).dump(-1, ' ', /*ensure_ascii=*/false);
        out += ": ";
        write_python_json(item, out);
      }
      out += '}';
      return;
    }
    case json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < value.size(); ++i) {
        if (i > 0) out += ", ";
        write_python_json(value[i], out);
      }
      out += ']';
      return;
    }
    case json::value_t::number_float:
      out += python_float(value.get<double>());
      return;
    default:
      out += value.dump(-1, ' ', /*ensure_ascii=*/false);
  }
}

// `value`, or the JSON a string value holds; false (the reason in `problem`) when that is not JSON.
bool parsed(const json& value, const char* what, json& out, std::string& problem) {
  if (!value.is_string()) {
    out = value;
    return true;
  }
  try {
    out = json::parse(value.get_ref<const std::string&>());
    return true;
  } catch (const json::parse_error& e) {
    problem = fmt::format("{} is a string that is not JSON: {}", what, e.what());
    return false;
  }
}

// A call or a tool description: OpenAI's {"type": "function", "function": {...}} unwrapped.
const json& unwrapped(const json& item) {
  const auto type = item.find("type");
  const auto function = item.find("function");
  if (type != item.end() && *type == "function" && function != item.end() && function->is_object())
    return *function;
  return item;
}

}  // namespace

std::string python_json(const json& value) {
  std::string out;
  write_python_json(value, out);
  return out;
}

std::string tools_system_text(const json& given, std::string& problem) {
  json tools;
  if (!parsed(given, "the tool list", tools, problem)) return "";
  if (tools.is_object()) tools = json::array({tools});
  if (!tools.is_array()) {
    problem = fmt::format("the tool list must be a list of function descriptions, got {}", tools.type_name());
    return "";
  }
  if (tools.empty()) return "";
  std::string text;
  for (size_t t = 0; t < tools.size(); ++t) {
    const json& tool = tools[t];
    if (!tool.is_object() || !unwrapped(tool).contains("name")) {
      problem = fmt::format("tool {} is not a function description (an object with a \"name\")", t);
      return "";
    }
    const auto type = tool.find("type");
    text += "\n" + python_json(type != tool.end() && *type == "function"
                                   ? tool
                                   : json{{"type", "function"}, {"function", tool}});
  }
  return fmt::format(kToolsPrompt, text);
}

std::string tool_calls_text(const json& given, std::string& problem) {
  json calls;
  if (!parsed(given, "the tool call", calls, problem)) return "";
  if (calls.is_object()) calls = json::array({calls});
  if (!calls.is_array() || calls.empty()) {
    problem = "a tool call must be an object with \"name\" and \"arguments\", or a non-empty list of them";
    return "";
  }
  std::string text;
  for (size_t c = 0; c < calls.size(); ++c) {
    const json& call = calls[c].is_object() ? unwrapped(calls[c]) : calls[c];
    const auto name = call.is_object() ? call.find("name") : call.end();
    const auto arguments = call.is_object() ? call.find("arguments") : call.end();
    if (name == call.end() || !name->is_string() || arguments == call.end()) {
      problem = fmt::format("tool call {} is not an object with a string \"name\" and \"arguments\"", c);
      return "";
    }
    if (c > 0) text += "\n";
    text += "<tool_call>\n{\"name\": " + python_json(*name) + ", \"arguments\": ";
    text += arguments->is_string() && json::accept(arguments->get_ref<const std::string&>())
                ? arguments->get<std::string>()
                : python_json(*arguments);
    text += "}\n</tool_call>";
  }
  return text;
}

std::string tool_responses_text(const std::vector<std::string>& results) {
  std::string text;
  for (size_t r = 0; r < results.size(); ++r)
    text += fmt::format("{}<tool_response>\n{}\n</tool_response>", r > 0 ? "\n" : "", results[r]);
  return text;
}

}  // namespace loom::data
