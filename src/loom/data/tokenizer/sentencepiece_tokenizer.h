// A SentencePiece model (.model file, unigram or BPE) behind Loom's Tokenizer interface, through the
// system's libsentencepiece (opened at run time; see the .cpp for why it is not linked).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/tokenizer/tokenizer.h"

namespace loom::data {

class SentencePieceTokenizer : public Tokenizer {
 public:
  static SentencePieceTokenizer load(const std::string& model_path);  // DataError naming the file

  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;
  ~SentencePieceTokenizer() override;

  // As spm_encode --output_format=id: the model's normalization, no BOS/EOS added.
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;  // DataError for unknown ids
  int64_t id(const std::string& piece) const override;                 // DataError if not a piece
  int64_t vocab_size() const override;

 private:
  struct Processor;
  SentencePieceTokenizer(std::unique_ptr<Processor> processor, std::string path);
  std::unique_ptr<Processor> processor_;
  std::string path_;
};

}  // namespace loom::data
