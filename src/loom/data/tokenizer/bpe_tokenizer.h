// Byte-level BPE read from a HuggingFace tokenizer.json (GPT-2 style and its descendants): added tokens
// matched first, NFC, regex pre-tokenization, the GPT-2 byte-to-unicode map and merges by rank.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "loom/data/tokenizer/tokenizer.h"

namespace loom::data {

// Unicode canonical composition (NFC) of UTF-8 text; DataError if the text is not valid UTF-8.
std::string normalize_nfc(const std::string& text);

class BpeTokenizer : public Tokenizer {
 public:
  // DataError naming the file for unreadable files and for settings Loom does not apply (a normalizer
  // other than NFC, pre-tokenizers other than Split(Regex, Isolated) + ByteLevel, dropout, ...).
  static BpeTokenizer load(const std::string& tokenizer_json_path);
  // The same from an already parsed file; `source` names it in error messages.
  static BpeTokenizer from_json(const nlohmann::json& root, const std::string& source);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer() override;

  // DataError if the text is not valid UTF-8. Safe to call from several threads at once.
  std::vector<int64_t> encode(const std::string& text) const override;
  // Bytes of the tokens joined; byte sequences that are not UTF-8 become U+FFFD. DataError for ids
  // outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids) const override;
  // Looks up a vocabulary entry as written in the file ("Ġthe", "<|im_start|>").
  int64_t id(const std::string& token) const override;
  int64_t vocab_size() const override;

  const std::string& token(int64_t id) const;  // the entry as written in the file; DataError if none
  bool is_special(int64_t id) const;           // an added token marked "special": true

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::data
