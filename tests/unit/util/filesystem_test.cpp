#include "loom/util/filesystem.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace loom {
namespace {

namespace fs = std::filesystem;

fs::path make_temp_root() {
  std::string pattern = (fs::temp_directory_path() / "loom-util-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

void touch(const fs::path& path) { std::ofstream(path) << "x"; }

TEST(RemoveTree, RemovesNestedDirectoriesAndFilesButNotWhatLinksPointTo) {
  const fs::path root = make_temp_root();
  const fs::path tree = root / "tree", outside = root / "outside";
  fs::create_directories(tree / "a" / "b");
  fs::create_directories(outside);
  touch(tree / "top.txt");
  touch(tree / "a" / "mid.txt");
  touch(tree / "a" / "b" / "leaf.txt");
  touch(outside / "kept.txt");
  fs::create_directory_symlink(outside, tree / "a" / "link");  // must not be followed

  std::error_code error;
  remove_tree(tree.string(), error);
  EXPECT_FALSE(error) << error.message();
  EXPECT_FALSE(fs::exists(fs::symlink_status(tree)));
  EXPECT_TRUE(fs::exists(outside / "kept.txt"));

  remove_tree(root.string(), error);
  EXPECT_FALSE(error) << error.message();
  EXPECT_FALSE(fs::exists(root));
}

TEST(RemoveTree, MissingPathIsNotAnErrorAndAFileIsRemoved) {
  const fs::path root = make_temp_root();
  std::error_code error;
  remove_tree((root / "never-created").string(), error);
  EXPECT_FALSE(error);
  touch(root / "file");
  remove_tree((root / "file").string(), error);
  EXPECT_FALSE(error);
  EXPECT_FALSE(fs::exists(root / "file"));
  remove_tree(root.string(), error);
  EXPECT_FALSE(error);
}

TEST(RemoveTree, ReportsTheErrnoOfAnEntryItCannotRemove) {
  const fs::path root = make_temp_root();
  std::error_code error;
  // A path through a regular file: lstat fails with ENOTDIR, which is an error, not absence.
  touch(root / "file");
  remove_tree((root / "file" / "child").string(), error);
  EXPECT_EQ(error, std::errc::not_a_directory);
  remove_tree(root.string(), error);
  EXPECT_FALSE(error);
}

}  // namespace
}  // namespace loom
