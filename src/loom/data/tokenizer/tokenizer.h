// The interface every Loom tokenizer offers (byte-level BPE, SentencePiece, word-level), and a factory
// that picks the right one from a file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids; special and added tokens written inline in the text become their own ids.
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t id(const std::string& token) const = 0;  // DataError if the token is unknown
  virtual int64_t vocab_size() const = 0;                  // one past the largest id
};

// A HuggingFace tokenizer.json with model.type "BPE" gives a BpeTokenizer, one with "WordLevel" a
// WordTokenizer; a SentencePiece ".model" file gives a SentencePieceTokenizer. DataError naming the
// file for anything else.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace loom::data
