// Tool turns of a conversation written as text, in the Hermes format (the chat templates of the
// tool-calling models Loom trains write it, and so do LLaMA-Factory's): tool descriptions appended to the
// system message inside <tools></tools>, each call as <tool_call>{"name": ..., "arguments": ...}</tool_call>
// in the assistant's reply, each result as <tool_response>...</tool_response> in a user turn.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace loom::data {

// JSON written as Python's json.dumps(value, ensure_ascii=False) writes it (and transformers'
// tojson filter): ", " between items, ": " after keys, keys in their order, non-ASCII as it is.
std::string python_json(const nlohmann::ordered_json& value);

// The text appended to the system message for a sample's tools: a list of function descriptions
// (each as {"name", "description", "parameters"} or OpenAI's {"type": "function", "function":
// {...}}), or one description, or that as a JSON string (LLaMA-Factory's column). "" for an empty
// list. The reason it cannot be used, in `problem`, otherwise "".
std::string tools_system_text(const nlohmann::ordered_json& tools, std::string& problem);

// An assistant turn's calls, each {"name": string, "arguments": ...} (or OpenAI's {"type":
// "function", "function": {...}}), one call or a list of them, or that as a JSON string:
// "<tool_call>\n{json}\n</tool_call>" per call, joined by "\n". Arguments given as a string of JSON
// text (OpenAI's form) are written as that text; others as python_json writes them.
// The reason they cannot be used, in `problem`, otherwise "".
std::string tool_calls_text(const nlohmann::ordered_json& calls, std::string& problem);

// Consecutive tool results as one user turn's text:
// "<tool_response>\n{result}\n</tool_response>" for each, joined by "\n".
std::string tool_responses_text(const std::vector<std::string>& results);

}  // namespace loom::data
