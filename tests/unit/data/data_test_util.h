// Helpers the data tests share: the message of an expected exception, checking that a message says
// every part it must, scratch files, the words of a line and a skip log's counts in one line.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "loom/data/conversation.h"
#include "loom/util/errors.h"

namespace loom::test {

// The message of the E that f throws, or a text saying none was thrown.
template <class E = DataError>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "no exception of the expected type";
}

// Success when message contains every one of parts; else a failure naming the first part it lacks.
inline ::testing::AssertionResult says_all(const std::string& message,
                                           const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "message '" << message << "' lacks '" << part << "'";
    }
  }
  return ::testing::AssertionSuccess();
}

// A file at path (relative to the test's working directory), removed at scope exit; written with
// text when given some, else left for the test to create.
struct TempFile {
  std::string path;
  explicit TempFile(std::string file) : path(std::move(file)) {}
  TempFile(std::string file, const std::string& text) : path(std::move(file)) {
    std::ofstream(path, std::ios::binary) << text;
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() { std::remove(path.c_str()); }
};

// The whitespace-separated words of line, each read as a T.
template <class T = std::string>
std::vector<T> words_of(const std::string& line) {
  std::istringstream in(line);
  std::vector<T> out;
  for (T w; in >> w;) out.push_back(w);
  return out;
}

// "missing M, corrupt C, bad B": what a SkipLog counted, comparable in one expectation.
inline std::string counts_of(const data::SkipLog& skips) {
  const data::SkipCounts counts = skips.counts();
  std::ostringstream out;
  out << "missing " << counts.missing_image << ", corrupt " << counts.corrupt_image << ", bad "
      << counts.bad_sample;
  return out.str();
}

}  // namespace loom::test
