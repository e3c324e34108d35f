// docs/config.md documents exactly the keys the config declares: each key table of the guide lists
// the keys that declared_keys() gives for the section (or list of mappings) its heading names.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/config/foreign_keys.h"

namespace loom::config {
namespace {

const std::string kGuide = std::string(LOOM_SOURCE_DIR) + "/docs/config.md";

// The `code spans` of a line of Markdown, in order.
std::vector<std::string> code_spans(const std::string& line) {
  std::vector<std::string> spans;
  for (size_t open = line.find('`'); open != std::string::npos; open = line.find('`', open)) {
    const size_t close = line.find('`', open + 1);
    if (close == std::string::npos) break;
    spans.push_back(line.substr(open + 1, close - open - 1));
    open = close + 1;
  }
  return spans;
}

// The keys the guide documents, by table: under a heading that quotes names (`## `training``,
// `### Entries of `data.datasets` and `data.eval_datasets``), the first table belongs to each of
// them, and the quoted names in the first cell of each of its rows are its keys.
std::map<std::string, std::set<std::string>> documented_keys(const std::string& path) {
  std::ifstream file(path);
  if (!file) ADD_FAILURE() << "cannot open " << path;
  std::map<std::string, std::set<std::string>> tables;
  std::vector<std::string> owners;  // of the next table
  bool in_code = false;
  int row = -1;  // in a table: its rows so far (the header and the |---| line first); else -1
  for (std::string line; std::getline(file, line);) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    if (in_code) continue;
    if (line.rfind('#', 0) == 0) {
      owners = code_spans(line);
      row = -1;
    } else if (line.rfind('|', 0) == 0 && !owners.empty()) {
      if (++row < 2) continue;
      const std::string first_cell = line.substr(1, line.find('|', 1) - 1);
      for (const auto& owner : owners)
        for (const auto& key : code_spans(first_cell)) tables[owner].insert(key);
    } else if (row >= 0) {
      owners.clear();  // only the first table after a heading lists keys
      row = -1;
    }
  }
  return tables;
}

TEST(ConfigDocs, EveryDeclaredKeyIsDocumentedAndNoOther) {
  const auto documented = documented_keys(kGuide);
  std::set<std::string> declared_tables;
  for (const auto& [table, keys] : declared_keys()) {
    declared_tables.insert(table);
    const auto found = documented.find(table);
    if (found == documented.end()) {
      ADD_FAILURE() << kGuide << ": no key table under a heading that names `" << table << "`";
      continue;
    }
    const std::set<std::string> declared(keys.begin(), keys.end());
    for (const auto& key : declared)
      EXPECT_TRUE(found->second.count(key)) << kGuide << ": " << table << "." << key
                                            << " is declared (src/loom/config/config.h) but not documented";
    for (const auto& key : found->second)
      EXPECT_TRUE(declared.count(key)) << kGuide << ": " << table << "." << key
                                       << " is documented but not declared in src/loom/config/config.h";
  }
  for (const auto& [table, keys] : documented)
    EXPECT_TRUE(declared_tables.count(table)) << kGuide << ": documents keys of `" << table << "`, which is "
                                              << "neither a section nor a list of mappings in one";
}

// The guide's reader finds tables as the guide writes them (so the test above cannot pass by
// reading nothing).
TEST(ConfigDocs, ReadsTheKeyTables) {
  const auto documented = documented_keys(kGuide);
  ASSERT_TRUE(documented.count("training"));
  EXPECT_TRUE(documented.at("training").count("lr"));
  ASSERT_TRUE(documented.count("data"));
  EXPECT_TRUE(documented.at("data").count("min_pixels"));  // a row of two keys
  EXPECT_TRUE(documented.at("data").count("max_pixels"));
  ASSERT_TRUE(documented.count("data.datasets"));
  EXPECT_TRUE(documented.at("data.datasets").count("weight"));
  EXPECT_FALSE(documented.at("data").count("weight"));  // the entries' table is not data's
}

// Its "Keys from other trainers" table lists every foreign name with its trainer and Loom key.
TEST(ConfigDocs, ListsEveryForeignKey) {
  std::ifstream file(kGuide);
  const std::string guide((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  for (const ForeignKey& k : foreign_keys())
    EXPECT_NE(guide.find(std::string("| `") + k.name + "` | " + k.from + " | `" + k.key + "` | " + k.convert +
                         " |"),
              std::string::npos)
        << kGuide << ": no row for " << k.name;
}

}  // namespace
}  // namespace loom::config
