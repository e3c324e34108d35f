#include "loom/data/json_samples.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "loom/util/errors.h"

namespace loom::data {
namespace {

using json = nlohmann::ordered_json;

std::string read_whole_file(const std::string& path, const std::string& kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("cannot open {} dataset {}", kind, path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// 1-based line and column of the character at 0-based offset `at` in text.
std::pair<int64_t, int64_t> line_and_column(const std::string& text, size_t at) {
  at = std::min(at, text.size());
  const int64_t line = 1 + std::count(text.begin(), text.begin() + at, '\n');
  const size_t newline = at == 0 ? std::string::npos : text.rfind('\n', at - 1);
  const int64_t column = static_cast<int64_t>(newline == std::string::npos ? at + 1 : at - newline);
  return {line, column};
}

// nlohmann's parse_error::byte counts the characters read, the offending one included.
size_t error_offset(const json::parse_error& e) { return e.byte == 0 ? 0 : e.byte - 1; }

}  // namespace

void for_each_json_sample(const std::string& path, const std::string& kind,
                          const std::function<void(const json&, int64_t)>& take) {
  const std::string text = read_whole_file(path, kind);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return;
  if (text[first] == '[') {
    json root_value;
    try {
      root_value = json::parse(text);
    } catch (const json::parse_error& e) {
      const auto [line, column] = line_and_column(text, error_offset(e));
      throw DataError(fmt::format("{} dataset {}: malformed JSON at line {}, column {}: {}", kind, path, line,
                                  column, e.what()));
    }
    for (size_t i = 0; i < root_value.size(); ++i) take(root_value[i], static_cast<int64_t>(i));
    return;
  }
  // JSON lines: one sample per non-blank line.
  int64_t line_number = 0, index = 0;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    ++line_number;
    const std::string line = text.substr(begin, end - begin);
    if (line.find_first_not_of(" \t\r") != std::string::npos) {
      json sample;
      try {
        sample = json::parse(line);
      } catch (const json::parse_error& e) {
        throw DataError(
            fmt::format("{} dataset {}: malformed JSON at line {}, column {} (sample {}, read as JSON "
                        "lines since the file does not start with '['): {}",
                        kind, path, line_number, error_offset(e) + 1, index, e.what()));
      }
      take(sample, index++);
    }
    begin = end + 1;
  }
}

}  // namespace loom::data
