// Shared helpers of the checkpoint tests: a fresh temporary directory per test (removed
// afterwards) and a check that an error names what it should.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/util/errors.h"
#include "loom/util/filesystem.h"

namespace loom::checkpoint::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "loom-checkpoint-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code error;
    remove_tree(path_.string(), error);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `body`, expecting a CheckpointError whose message contains every one of `parts`.
template <typename Body>
void expect_checkpoint_error(Body body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "expected a CheckpointError mentioning '" << parts.front() << "'";
  } catch (const CheckpointError& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << part << "'";
    }
  }
}

}  // namespace loom::checkpoint::testing
