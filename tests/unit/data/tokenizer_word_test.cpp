// Word tokenizer: ids, special tokens, unknown words, tokenizer.json save/load and bad files.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/util/errors.h"

using loom::data::WordTokenizer;
using loom::test::message_of;
using loom::test::TempFile;

namespace {

const std::string kPrefix = "word_tokenizer_test_";  // of scratch files in the working directory

WordTokenizer small() {
  return WordTokenizer::from_words({"what", "color", "is", "the", "circle", "?", "red"});
}

}  // namespace

TEST(WordTokenizer, SpecialsComeFirstThenWordsInOrder) {
  const WordTokenizer tok = small();
  EXPECT_EQ(tok.vocab_size(), 15);
  const std::vector<std::string> specials = {"<|endoftext|>",    "<|im_start|>",   "<|im_end|>",
                                             "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                             "<|video_pad|>",    "<unk>"};
  EXPECT_EQ(WordTokenizer::special_tokens(), specials);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(tok.id(specials[i]), i);
  EXPECT_EQ(tok.id("what"), 8);
  EXPECT_EQ(tok.id("red"), 14);
  EXPECT_THROW(tok.id("blue"), loom::DataError);
}

// A model's image block tokens (InternVL's <img> <IMG_CONTEXT> </img>) follow the standard specials,
// those already among them left out (Qwen2-VL's keep their ids), and are whole tokens, saved as added.
TEST(WordTokenizer, ExtraSpecialsFollowTheStandardOnes) {
  const WordTokenizer tok = WordTokenizer::from_words({"what", "red"}, {"<img>", "<IMG_CONTEXT>", "</img>"});
  EXPECT_EQ(tok.id("<img>"), 8);
  EXPECT_EQ(tok.id("<IMG_CONTEXT>"), 9);
  EXPECT_EQ(tok.id("</img>"), 10);
  EXPECT_EQ(tok.id("what"), 11);
  EXPECT_EQ(tok.encode("what<img><IMG_CONTEXT></img>red"), (std::vector<int64_t>{11, 8, 9, 10, 12}));
  const WordTokenizer qwen =
      WordTokenizer::from_words({"what", "red"}, {"<|vision_start|>", "<|image_pad|>", "<|vision_end|>"});
  EXPECT_EQ(qwen.id("<|image_pad|>"), 5);
  EXPECT_EQ(qwen.id("what"), 8);
  TempFile file(kPrefix + "extra.json");
  tok.save(file.path);
  const WordTokenizer back = WordTokenizer::load(file.path);
  EXPECT_EQ(back.encode("what<img><IMG_CONTEXT></img>red"), tok.encode("what<img><IMG_CONTEXT></img>red"));
}

TEST(WordTokenizer, EncodesWordsAndDecodesWithSingleSpaces) {
  const WordTokenizer tok = small();
  EXPECT_EQ(tok.encode("what color is the circle ?"), (std::vector<int64_t>{8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(tok.encode("  what\tcolor\n\nis  "), (std::vector<int64_t>{8, 9, 10}));
  EXPECT_EQ(tok.encode(""), std::vector<int64_t>{});
  EXPECT_EQ(tok.decode({8, 9, 10, 11, 12, 13}), "what color is the circle ?");
  EXPECT_EQ(tok.decode(tok.encode("  what\tcolor\n\nis  ")), "what color is");
  EXPECT_EQ(tok.decode({}), "");
  EXPECT_THROW(tok.decode({15}), loom::DataError);
  EXPECT_THROW(tok.decode({-1}), loom::DataError);
}

TEST(WordTokenizer, SpecialsAreWholeTokensEvenWithoutSpaces) {
  const WordTokenizer tok = small();
  EXPECT_EQ(
      tok.encode("<|im_start|>what<|vision_start|><|image_pad|><|image_pad|><|vision_end|>red ?<|im_end|>"),
      (std::vector<int64_t>{1, 8, 3, 5, 5, 4, 14, 13, 2}));
  EXPECT_EQ(tok.encode("<|endoftext|> <|video_pad|>"), (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(tok.decode({1, 8, 3, 5, 4, 2}),
            "<|im_start|> what <|vision_start|> <|image_pad|> <|vision_end|> <|im_end|>");
  // A near-miss of a special is an ordinary (unknown) word.
  EXPECT_EQ(tok.encode("<|im_start| what"), (std::vector<int64_t>{7, 8}));
}

TEST(WordTokenizer, UnknownWordsBecomeUnk) {
  const WordTokenizer tok = small();
  EXPECT_EQ(tok.encode("what colour is the Circle ? <unk>"), (std::vector<int64_t>{8, 7, 10, 11, 7, 13, 7}));
  EXPECT_EQ(tok.decode(tok.encode("blue circle")), "<unk> circle");
}

TEST(WordTokenizer, RejectsBadWordLists) {
  EXPECT_THROW(WordTokenizer::from_words({"a", "b", "a"}), loom::DataError);
  EXPECT_THROW(WordTokenizer::from_words({"a b"}), loom::DataError);
  EXPECT_THROW(WordTokenizer::from_words({""}), loom::DataError);
  EXPECT_THROW(WordTokenizer::from_words({"<|im_end|>"}), loom::DataError);
}

TEST(WordTokenizer, SaveWritesHuggingFaceWordLevelAndLoadsBack) {
  const WordTokenizer tok = small();
  TempFile file(kPrefix + "save.json");
  tok.save(file.path);

  std::ifstream in(file.path);
  const nlohmann::json json = nlohmann::json::parse(in);
  EXPECT_EQ(json["model"]["type"], "WordLevel");
  EXPECT_EQ(json["model"]["unk_token"], "<unk>");
  EXPECT_EQ(json["model"]["vocab"].size(), 15u);
  EXPECT_EQ(json["model"]["vocab"]["circle"], 12);
  EXPECT_EQ(json["model"]["vocab"]["<|im_end|>"], 2);
  EXPECT_EQ(json["pre_tokenizer"]["type"], "WhitespaceSplit");
  ASSERT_EQ(json["added_tokens"].size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(json["added_tokens"][i]["id"], i);
    EXPECT_EQ(json["added_tokens"][i]["content"], WordTokenizer::special_tokens()[i]);
    EXPECT_EQ(json["added_tokens"][i]["special"], true);
  }

  const WordTokenizer back = WordTokenizer::load(file.path);
  EXPECT_EQ(back.vocab_size(), 15);
  const std::string text = "<|im_start|>what color is the circle ?<|im_end|> blue";
  EXPECT_EQ(back.encode(text), tok.encode(text));
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(back.decode({i}), tok.decode({i}));
}

TEST(WordTokenizer, LoadsAHandWrittenTokenizerJson) {
  // Written by hand in the layout HuggingFace tokenizers uses; the vocab map is not in id order,
  // one special lives only in added_tokens and the unknown token has another name.
  TempFile file(kPrefix + "hand.json", R"({
    "version": "1.0",
    "truncation": null,
    "padding": null,
    "added_tokens": [
      {"id": 0, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true},
      {"id": 4, "content": "<sep>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true}
    ],
    "normalizer": null,
    "pre_tokenizer": {"type": "WhitespaceSplit"},
    "post_processor": null,
    "decoder": null,
    "model": {"type": "WordLevel", "vocab": {"world": 3, "[UNK]": 0, "hello": 1, ",": 2}, "unk_token": "[UNK]"}
  })");
  const WordTokenizer tok = WordTokenizer::load(file.path);
  EXPECT_EQ(tok.vocab_size(), 5);
  EXPECT_EQ(tok.encode("hello , world<sep>hello moon"), (std::vector<int64_t>{1, 2, 3, 4, 1, 0}));
  EXPECT_EQ(tok.decode({1, 2, 3, 4, 0}), "hello , world <sep> [UNK]");
  EXPECT_EQ(tok.id("<sep>"), 4);
}

TEST(WordTokenizer, BadFilesNameTheFile) {
  const std::string missing = message_of([] { WordTokenizer::load("no_such_dir/tokenizer.json"); });
  EXPECT_NE(missing.find("no_such_dir/tokenizer.json"), std::string::npos) << missing;

  TempFile not_json(kPrefix + "not_json.json", "{ \"model\": ");
  EXPECT_NE(message_of([&] { WordTokenizer::load(not_json.path); }).find(not_json.path), std::string::npos);

  TempFile bpe(kPrefix + "bpe.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  const std::string bpe_message = message_of([&] { WordTokenizer::load(bpe.path); });
  EXPECT_NE(bpe_message.find(bpe.path), std::string::npos);
  EXPECT_NE(bpe_message.find("WordLevel"), std::string::npos);

  TempFile gap(kPrefix + "gap.json",
               R"({"model": {"type": "WordLevel", "vocab": {"a": 0, "b": 2}, "unk_token": "a"}})");
  EXPECT_NE(message_of([&] { WordTokenizer::load(gap.path); }).find(gap.path), std::string::npos);

  TempFile twice(kPrefix + "twice.json",
                 R"({"model": {"type": "WordLevel", "vocab": {"a": 0, "b": 0}, "unk_token": "a"}})");
  EXPECT_NE(message_of([&] { WordTokenizer::load(twice.path); }).find(twice.path), std::string::npos);

  TempFile no_unk(kPrefix + "no_unk.json",
                  R"({"model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "x"}})");
  EXPECT_NE(message_of([&] { WordTokenizer::load(no_unk.path); }).find("unk_token"), std::string::npos);

  TempFile split(kPrefix + "split.json", R"({"pre_tokenizer": {"type": "Whitespace"},
    "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}})");
  EXPECT_NE(message_of([&] { WordTokenizer::load(split.path); }).find("WhitespaceSplit"), std::string::npos);
}

TEST(WordTokenizer, IsATokenizerAndLoadTokenizerGivesOne) {
  const WordTokenizer tok = small();
  const loom::data::Tokenizer& base = tok;
  // ids: 8 what, 9 color, 10 is, 11 the, 12 circle, 13 ?, 14 red; <|im_start|> 1, <unk> 7.
  EXPECT_EQ(base.encode("<|im_start|>what color is the circle ? blue"),
            (std::vector<int64_t>{1, 8, 9, 10, 11, 12, 13, 7}));
  EXPECT_EQ(base.decode({14, 12}), "red circle");
  EXPECT_EQ(base.id("?"), 13);
  EXPECT_EQ(base.vocab_size(), 15);

  TempFile file(kPrefix + "interface.json");
  tok.save(file.path);
  const std::unique_ptr<loom::data::Tokenizer> loaded = loom::data::load_tokenizer(file.path);
  const auto* word = dynamic_cast<const WordTokenizer*>(loaded.get());
  ASSERT_NE(word, nullptr);
  EXPECT_EQ(word->encode("the red circle<|im_end|>"), (std::vector<int64_t>{11, 14, 12, 2}));
  EXPECT_EQ(loaded->vocab_size(), 15);
}
