// A word-level tokenizer for the built-in datasets, stored as a HuggingFace tokenizer.json
// (WordLevel model, WhitespaceSplit pre-tokenizer, special tokens as added_tokens).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/data/tokenizer/tokenizer.h"

namespace loom::data {

class WordTokenizer : public Tokenizer {
 public:
  // The special tokens every word tokenizer starts with, ids 0..7 in this order.
  static const std::vector<std::string>& special_tokens();

  // Specials first, then the words in the given order (ids 8, 9, ...). A word must be non-empty,
  // contain no whitespace, not be a special token and not repeat.
  // `extra_specials` (a model's image block tokens) follow the standard ones, those among them left
  // out, before the words.
  static WordTokenizer from_words(const std::vector<std::string>& words,
                                  const std::vector<std::string>& extra_specials = {});
  static WordTokenizer load(const std::string& tokenizer_json_path);  // DataError naming the file
  void save(const std::string& path) const;

  // Special tokens are recognised as whole tokens even without surrounding spaces; every other
  // whitespace-separated word maps to its id, or to <unk> when it is not in the vocabulary.
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;  // words joined by single spaces
  int64_t id(const std::string& token) const override;                 // DataError if unknown
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }

 private:
  std::vector<std::string> tokens_;               // id -> token
  std::unordered_map<std::string, int64_t> ids_;  // token -> id
  std::vector<std::string> specials_;             // added tokens, longest first for matching
  int64_t unk_id_ = -1;
};

}  // namespace loom::data
