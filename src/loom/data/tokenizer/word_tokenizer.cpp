// Word-level tokenizer: tokenizer.json reading and writing, encoding and decoding.
#include "loom/data/tokenizer/word_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/util/errors.h"

namespace loom::data {
namespace {

using ordered_json = nlohmann::ordered_json;

bool has_space(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

void split_words(const std::string& text, std::vector<std::string>& out) {
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
}

}  // namespace

const std::vector<std::string>& WordTokenizer::special_tokens() {
  static const std::vector<std::string> specials = {"<|endoftext|>",    "<|im_start|>",   "<|im_end|>",
                                                    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                                    "<|video_pad|>",    "<unk>"};
  return specials;
}

WordTokenizer WordTokenizer::from_words(const std::vector<std::string>& words,
                                        const std::vector<std::string>& extra_specials) {
  WordTokenizer tok;
  for (const std::string& s : special_tokens()) {
    tok.ids_.emplace(s, static_cast<int64_t>(tok.tokens_.size()));
    tok.tokens_.push_back(s);
  }
  tok.specials_ = special_tokens();
  for (const std::string& s : extra_specials) {
    if (s.empty() || has_space(s))
      throw DataError(
          fmt::format("word tokenizer: special token '{}' must be non-empty without whitespace", s));
    if (!tok.ids_.emplace(s, static_cast<int64_t>(tok.tokens_.size())).second) continue;
    tok.tokens_.push_back(s);
    tok.specials_.push_back(s);
  }
  for (const std::string& w : words) {
    if (w.empty() || has_space(w)) {
      throw DataError(
          fmt::format("word tokenizer: word '{}' must be non-empty and contain no whitespace", w));
    }
    if (!tok.ids_.emplace(w, static_cast<int64_t>(tok.tokens_.size())).second) {
      throw DataError(fmt::format("word tokenizer: word '{}' is given twice or is a special token", w));
    }
    tok.tokens_.push_back(w);
  }
  tok.unk_id_ = tok.ids_.at("<unk>");
  std::stable_sort(tok.specials_.begin(), tok.specials_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return tok;
}

WordTokenizer WordTokenizer::load(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw DataError(fmt::format("cannot open tokenizer file {}", path));
  ordered_json root;
  try {
    root = ordered_json::parse(file);
  } catch (const std::exception& e) {
    throw DataError(fmt::format("tokenizer file {} is not valid JSON: {}", path, e.what()));
  }
  auto fail = [&](const std::string& what) {
    return DataError(fmt::format("tokenizer file {}: {}", path, what));
  };
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object()) {
    throw fail("no \"model\" object");
  }
  const ordered_json& model = root["model"];
  if (model.value("type", std::string()) != "WordLevel") {
    throw fail("model.type must be \"WordLevel\" for a word tokenizer");
  }
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    throw fail("normalizer must be null for a word tokenizer");
  }
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null() &&
      root["pre_tokenizer"].value("type", std::string()) != "WhitespaceSplit") {
    throw fail("pre_tokenizer must be {\"type\": \"WhitespaceSplit\"} or null");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw fail("model.vocab must be an object");

  std::map<int64_t, std::string> by_id;
  WordTokenizer tok;
  auto add = [&](const std::string& token, const ordered_json& id_json) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0) {
      throw fail(fmt::format("token '{}' needs a non-negative integer id", token));
    }
    const int64_t id = id_json.get<int64_t>();
    auto [it, inserted] = tok.ids_.emplace(token, id);
    if (!inserted && it->second != id) {
      throw fail(fmt::format("token '{}' has two ids, {} and {}", token, it->second, id));
    }
    auto [slot, fresh] = by_id.emplace(id, token);
    if (!fresh && slot->second != token) {
      throw fail(fmt::format("id {} is given to both '{}' and '{}'", id, slot->second, token));
    }
  };
  for (const auto& [token, id] : model["vocab"].items()) add(token, id);
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    if (!root["added_tokens"].is_array()) throw fail("added_tokens must be a list");
    for (const ordered_json& added : root["added_tokens"]) {
      if (!added.is_object() || !added.contains("content") || !added["content"].is_string() ||
          !added.contains("id")) {
        throw fail("each added_tokens entry needs \"id\" and \"content\"");
      }
      const std::string content = added["content"].get<std::string>();
      if (content.empty()) throw fail("an added token is empty");
      add(content, added["id"]);
      tok.specials_.push_back(content);
    }
  }
  if (by_id.empty() || by_id.rbegin()->first != static_cast<int64_t>(by_id.size()) - 1) {
    throw fail(fmt::format("ids must be exactly 0..{} with none missing", by_id.size() - 1));
  }
  for (auto& [id, token] : by_id) tok.tokens_.push_back(token);

  if (!model.contains("unk_token") || !model["unk_token"].is_string())
    throw fail("model.unk_token is missing");
  const std::string unk = model["unk_token"].get<std::string>();
  auto unk_it = tok.ids_.find(unk);
  if (unk_it == tok.ids_.end()) throw fail(fmt::format("unk_token '{}' is not in the vocabulary", unk));
  tok.unk_id_ = unk_it->second;
  std::stable_sort(tok.specials_.begin(), tok.specials_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return tok;
}

void WordTokenizer::save(const std::string& path) const {
  ordered_json added = ordered_json::array();
  // Added tokens in id order, so the file reads the same as one written by HuggingFace.
  std::vector<std::pair<int64_t, std::string>> specials;
  for (const std::string& s : specials_) specials.emplace_back(ids_.at(s), s);
  std::sort(specials.begin(), specials.end());
  for (const auto& [id, content] : specials) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < tokens_.size(); ++id) vocab[tokens_[id]] = id;
  ordered_json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "WhitespaceSplit"}}},
      {"post_processor", nullptr},
      {"decoder", nullptr},
      {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", tokens_.at(unk_id_)}}}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << root.dump(2) << "\n";
    if (!out) throw DataError(fmt::format("cannot write tokenizer file {}", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw DataError(fmt::format("cannot move tokenizer file {} to {}", tmp, path));
  }
}

std::vector<int64_t> WordTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  std::vector<std::string> words;
  auto flush = [&](size_t from, size_t to) {
    words.clear();
    split_words(text.substr(from, to - from), words);
    for (const std::string& w : words) {
      auto it = ids_.find(w);
      ids.push_back(it == ids_.end() ? unk_id_ : it->second);
    }
  };
  size_t segment = 0;
  for (size_t i = 0; i < text.size();) {
    const std::string* match = nullptr;
    for (const std::string& s : specials_) {  // longest first
      if (text.compare(i, s.size(), s) == 0) {
        match = &s;
        break;
      }
    }
    if (!match) {
      ++i;
      continue;
    }
    flush(segment, i);
    ids.push_back(ids_.at(*match));
    i += match->size();
    segment = i;
  }
  flush(segment, text.size());
  return ids;
}

std::string WordTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      throw DataError(fmt::format("token id {} at position {} is outside the vocabulary [0, {})", ids[i], i,
                                  vocab_size()));
    }
    if (i > 0) text += ' ';
    text += tokens_[ids[i]];
  }
  return text;
}

int64_t WordTokenizer::id(const std::string& token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) {
    throw DataError(
        fmt::format("token '{}' is not in the word tokenizer's vocabulary of {}", token, vocab_size()));
  }
  return it->second;
}

}  // namespace loom::data
