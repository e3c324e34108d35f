// Reading a dataset file of JSON samples, as MindSpeed MM / LLaMA-Factory users write them: a JSON
// array, or JSON lines. Objects keep their keys in the file's order (ordered_json), so what Loom
// writes back from a sample (a tool call's arguments) reads as the user wrote it.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::data {

// Calls take(sample, index) for each sample of the file in order: the elements of a JSON array when
// its first non-blank character is '[', else one per non-blank line (JSON lines). DataError naming
// "<kind> dataset PATH" for a file that cannot be opened, and the line and column (and the sample)
// for malformed JSON.
void for_each_json_sample(const std::string& path, const std::string& kind,
                          const std::function<void(const nlohmann::ordered_json&, int64_t)>& take);

}  // namespace loom::data
