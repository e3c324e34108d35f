// SentencePiece: a tiny model trained by Debian's spm_train, against the ids and pieces of spm_encode.
#include <gtest/gtest.h>

#include <fstream>

#include "data_test_util.h"
#include "loom/data/tokenizer/sentencepiece_tokenizer.h"

using loom::data::SentencePieceTokenizer;
using loom::test::message_of;
using loom::test::words_of;
using Ids = std::vector<int64_t>;

namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/";

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

const SentencePieceTokenizer& tiny() {
  static const SentencePieceTokenizer tokenizer = SentencePieceTokenizer::load(kDir + "spm_tiny.model");
  return tokenizer;
}

}  // namespace

TEST(SentencePieceTokenizer, IdsMatchSpmEncode) {
  const auto texts = read_lines(kDir + "spm_texts.txt");
  const auto ids = read_lines(kDir + "spm_expected_ids.txt");
  ASSERT_EQ(texts.size(), 5u);
  ASSERT_EQ(ids.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(tiny().encode(texts[i]), words_of<int64_t>(ids[i])) << texts[i];
}

TEST(SentencePieceTokenizer, DecodeInvertsEncodeForKnownText) {
  const auto texts = read_lines(kDir + "spm_texts.txt");
  for (size_t i : {0, 1, 4}) EXPECT_EQ(tiny().decode(tiny().encode(texts[i])), texts[i]);
  // The model's nmt_nfkc rules collapse runs of spaces and strip the ends.
  EXPECT_EQ(tiny().decode(tiny().encode("  the   loom ")), "the loom");
}

TEST(SentencePieceTokenizer, PiecesAndIds) {
  const auto ids = read_lines(kDir + "spm_expected_ids.txt");
  const auto pieces = read_lines(kDir + "spm_expected_pieces.txt");
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto line_ids = words_of<int64_t>(ids[i]);
    const auto line_pieces = words_of<std::string>(pieces[i]);
    ASSERT_EQ(line_ids.size(), line_pieces.size());
    for (size_t k = 0; k < line_ids.size(); ++k) {
      if (line_ids[k] == 0) continue;  // <unk>: spm_encode prints the text it stands for
      EXPECT_EQ(tiny().id(line_pieces[k]), line_ids[k]) << line_pieces[k];
    }
  }
  EXPECT_EQ(tiny().vocab_size(), 200);
  EXPECT_EQ(tiny().id("<unk>"), 0);
  EXPECT_NE(message_of([] { tiny().id("zebra"); }).find("'zebra'"), std::string::npos);
  EXPECT_NE(message_of([] { tiny().decode({200}); }).find("200"), std::string::npos);
}

TEST(SentencePieceTokenizer, Errors) {
  EXPECT_NE(message_of([] { SentencePieceTokenizer::load("no_such.model"); }).find("no_such.model"),
            std::string::npos);
  const std::string not_a_model = kDir + "spm_texts.txt";
  EXPECT_NE(message_of([&] { SentencePieceTokenizer::load(not_a_model); }).find(not_a_model),
            std::string::npos);
}

TEST(LoadTokenizer, PicksSentencePieceForModelFiles) {
  auto tokenizer = loom::data::load_tokenizer(kDir + "spm_tiny.model");
  ASSERT_NE(dynamic_cast<SentencePieceTokenizer*>(tokenizer.get()), nullptr);
  EXPECT_EQ(tokenizer->encode("The loom"), tiny().encode("The loom"));
}
