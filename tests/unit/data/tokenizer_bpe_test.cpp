// Byte-level BPE: Qwen3's tokenizer.json against the ids of its JavaScript encoder, a hand-made file
// with merges in both forms and hand-worked ids, NFC against Python's unicodedata, unsupported files.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "data_test_util.h"
#include "loom/data/tokenizer/bpe_tokenizer.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/util/errors.h"

using loom::data::BpeTokenizer;
using loom::test::message_of;
using loom::test::says_all;
using loom::test::TempFile;
using nlohmann::json;
using Ids = std::vector<int64_t>;

namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/";

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

const BpeTokenizer& qwen3() {
  static const BpeTokenizer tokenizer = BpeTokenizer::load(kDir + "qwen3_tokenizer.json");
  return tokenizer;
}

const BpeTokenizer& tiny() {
  static const BpeTokenizer tokenizer = BpeTokenizer::load(kDir + "tiny_bpe_tokenizer.json");
  return tokenizer;
}

// A pre_tokenizer "Sequence" of the given steps.
json sequence(std::vector<json> steps) { return {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}}; }

// A "Split" pre-tokenizer step on regex with the given behavior.
json split(const std::string& regex, const std::string& behavior) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}};
}

const json kByteLevel = {{"type", "ByteLevel"}, {"use_regex", false}};

}  // namespace

TEST(BpeTokenizer, Qwen3IdsMatchTheJavaScriptEncoder) {
  const json expected = read_json(kDir + "qwen3_expected.json");
  ASSERT_EQ(expected["cases"].size(), 340u);
  for (const json& c : expected["cases"]) {
    const std::string text = c["text"];
    const Ids ids = c["ids"].get<Ids>();
    EXPECT_EQ(qwen3().encode(text), ids) << json(text).dump();
    EXPECT_EQ(qwen3().decode(ids), c["decoded"].get<std::string>()) << json(text).dump();
  }
}

TEST(BpeTokenizer, Qwen3DecodeInvertsEncode) {
  // decode(encode(text)) is the text itself, or its NFC form where NFC changes it.
  const json expected = read_json(kDir + "qwen3_expected.json");
  int unchanged = 0;
  for (const json& c : expected["cases"]) {
    const std::string text = c["text"];
    const std::string nfc = loom::data::normalize_nfc(text);
    EXPECT_EQ(qwen3().decode(qwen3().encode(text)), nfc) << json(text).dump();
    unchanged += nfc == text;
  }
  EXPECT_GT(unchanged, 300);
  const std::string decomposed = "cafe\xCC\x81";  // e + U+0301 encodes as the precomposed é
  EXPECT_EQ(qwen3().encode(decomposed), qwen3().encode("caf\xC3\xA9"));
}

TEST(BpeTokenizer, Qwen3Vocabulary) {
  const json file = read_json(kDir + "qwen3_tokenizer.json");
  EXPECT_EQ(qwen3().vocab_size(), 151669);
  for (const char* token : {"user", "\xC4\xA0the", "\xC4\x8A", "!", "\xC4\xA0\xC4\xA0\xC4\xA0"}) {
    EXPECT_EQ(qwen3().id(token), file["model"]["vocab"][token].get<int64_t>()) << token;
    EXPECT_EQ(qwen3().token(qwen3().id(token)), token);
  }
  EXPECT_EQ(qwen3().id("<|im_start|>"), 151644);
  EXPECT_EQ(qwen3().id("</think>"), 151668);
  EXPECT_TRUE(qwen3().is_special(151645));   // <|im_end|>
  EXPECT_FALSE(qwen3().is_special(151667));  // <think>
  EXPECT_FALSE(qwen3().is_special(872));     // user
  EXPECT_NE(message_of([] { qwen3().id("not a token"); }).find("not a token"), std::string::npos);
  EXPECT_NE(message_of([] { qwen3().decode({151669}); }).find("151669"), std::string::npos);
  EXPECT_NE(message_of([] { qwen3().decode({-1}); }).find("-1"), std::string::npos);
}

TEST(BpeTokenizer, Qwen3EncodesTheSameFromManyThreads) {
  const json expected = read_json(kDir + "qwen3_expected.json");
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        for (const json& c : expected["cases"]) {
          if (qwen3().encode(c["text"].get<std::string>()) != c["ids"].get<Ids>()) ++wrong[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST(BpeTokenizer, MergesInPairAndStringForm) {
  // Ids 0..255 are bytes; merges: (h,e)->256 (l,l)->257 "he ll"->258 (Ġ,w)->259 (hell,o)->260.
  // "hello": h e l l o -> he l l o -> he ll o -> hell o -> hello. " world": Ġw o r l d.
  EXPECT_EQ(tiny().encode("hello world"), (Ids{260, 259, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(tiny().encode("hell"), (Ids{258}));
  EXPECT_EQ(tiny().encode("hehe"), (Ids{256, 256}));
  EXPECT_EQ(tiny().encode("lll"), (Ids{257, 'l'}));  // leftmost first among equal ranks
  EXPECT_EQ(tiny().encode("ehll"), (Ids{'e', 'h', 257}));
  EXPECT_EQ(tiny().encode(" w  w"), (Ids{259, ' ', 259}));  // "\s+(?!\S)" leaves the last space to " w"
  EXPECT_EQ(tiny().encode("w  "), (Ids{'w', ' ', ' '}));    // trailing spaces stay one piece
  EXPECT_EQ(tiny().encode(""), Ids{});
  EXPECT_EQ(tiny().vocab_size(), 264);
  EXPECT_EQ(tiny().id("hello"), 260);
  EXPECT_EQ(tiny().id("\xC4\xA0w"), 259);
}

TEST(BpeTokenizer, AddedTokensAreMatchedFirst) {
  EXPECT_EQ(tiny().encode("hello<|end|>hello"), (Ids{260, 261, 260}));
  EXPECT_EQ(tiny().encode("<|end|><|end|>"), (Ids{261, 261}));
  EXPECT_TRUE(tiny().is_special(261));
  // <mask> has lstrip and rstrip: the spaces around it belong to it.
  EXPECT_EQ(tiny().encode("a <mask> b"), (Ids{'a', 262, 'b'}));
  EXPECT_EQ(tiny().decode({'a', 262, 'b'}), "a<mask>b");
  // xx is single_word: matched only between non-word characters.
  EXPECT_EQ(tiny().encode("xx yy"), (Ids{263, 32, 'y', 'y'}));
  EXPECT_EQ(tiny().encode("axx"), (Ids{'a', 'x', 'x'}));
  EXPECT_EQ(tiny().encode("xx!"), (Ids{263, '!'}));
}

TEST(BpeTokenizer, DecodeReplacesBrokenUtf8) {
  EXPECT_EQ(tiny().decode({0xE4, 0xB8, 0xAD}), "\xE4\xB8\xAD");  // 中
  EXPECT_EQ(tiny().decode({0xE4}), "\xEF\xBF\xBD");
  EXPECT_EQ(tiny().decode({0xE4, 0xB8, 'a'}),
            "\xEF\xBF\xBD"
            "a");  // one U+FFFD for E4 B8
  EXPECT_EQ(tiny().decode({0xFF, 0xC0, 0x80}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tiny().decode({260, 261}), "hello<|end|>");
}

TEST(BpeTokenizer, EncodeRejectsInvalidUtf8) {
  EXPECT_NE(message_of([] { tiny().encode("ab\xE4"); }).find("byte 2"), std::string::npos);
  EXPECT_NE(message_of([] { tiny().encode("\xC0\x80"); }).find("UTF-8"), std::string::npos);
}

TEST(BpeTokenizer, NfcMatchesPythonUnicodedata) {
  const json cases = read_json(kDir + "nfc_cases.json")["cases"];
  ASSERT_GT(cases.size(), 4000u);
  size_t wrong = 0;
  for (const json& c : cases) {
    const std::string input = c[0], expected = c[1];
    if (loom::data::normalize_nfc(input) != expected && ++wrong <= 5) {
      ADD_FAILURE() << json(input).dump() << " -> " << json(loom::data::normalize_nfc(input)).dump()
                    << ", want " << json(expected).dump();
    }
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(BpeTokenizer, RejectsSettingsItDoesNotApply) {
  const json base = read_json(kDir + "tiny_bpe_tokenizer.json");
  struct Case {
    const char* name;
    std::function<void(json&)> change;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"lowercase",
       [](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer"},
      {"whitespace",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer \"Whitespace\""},
      {"no_byte_level", [](json& j) { j["pre_tokenizer"] = sequence({split("\\s+", "Isolated")}); },
       "no ByteLevel"},
      {"removed",
       [](json& j) {
         j["pre_tokenizer"] = sequence({split("\\s+", "Removed"), kByteLevel});
       },
       "behavior \"Removed\""},
      {"lookahead",
       [](json& j) {
         j["pre_tokenizer"] = sequence({split("a(?=b)|\\s+", "Isolated"), kByteLevel});
       },
       "lookaround"},
      {"decoder", [](json& j) { j["decoder"] = nullptr; }, "decoder"},
      {"template",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "TemplateProcessing"},
      {"template_adding_a_token",  // one that adds nothing (transformers 5's for Qwen) loads
       [](json& j) {
         j["post_processor"] = {
             {"type", "TemplateProcessing"},
             {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
             {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}}}}};
       },
       "TemplateProcessing"},
      {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "dropout"},
      {"byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {"unknown_merge",
       [](json& j) {
         j["model"]["merges"].push_back({"hello", "w"});
       },
       "not in model.vocab"},
      {"bad_merge", [](json& j) { j["model"]["merges"].push_back("h e l"); }, "merge #5"},
      {"missing_byte", [](json& j) { j["model"]["vocab"].erase("!"); }, "byte 0x21"},
      {"truncation",
       [](json& j) {
         j["truncation"] = {{"max_length", 8}};
       },
       "truncation"},
  };
  for (const Case& c : cases) {
    json changed = base;
    c.change(changed);
    const TempFile file(std::string("bpe_tokenizer_test_") + c.name + ".json", changed.dump());
    const std::string message = message_of([&] { BpeTokenizer::load(file.path); });
    EXPECT_TRUE(says_all(message, {file.path, c.says})) << c.name;
  }
  EXPECT_NE(message_of([] { BpeTokenizer::load("no_such_tokenizer.json"); }).find("no_such_tokenizer.json"),
            std::string::npos);
}

TEST(LoadTokenizer, PicksTheTokenizerFromTheFile) {
  auto bpe = loom::data::load_tokenizer(kDir + "tiny_bpe_tokenizer.json");
  ASSERT_NE(dynamic_cast<BpeTokenizer*>(bpe.get()), nullptr);
  EXPECT_EQ(bpe->encode("hello<|end|>"), (Ids{260, 261}));

  const auto words = loom::data::WordTokenizer::from_words({"what", "color", "is", "it", "?"});
  const TempFile words_file("bpe_tokenizer_test_words.json");
  words.save(words_file.path);
  auto word_level = loom::data::load_tokenizer(words_file.path);
  EXPECT_EQ(word_level->encode("what color is it ?<|im_end|>"), words.encode("what color is it ?<|im_end|>"));
  EXPECT_EQ(word_level->decode(words.encode("what is it")), "what is it");
  EXPECT_EQ(word_level->id("color"), words.id("color"));
  EXPECT_EQ(word_level->vocab_size(), words.vocab_size());

  json unigram = read_json(kDir + "tiny_bpe_tokenizer.json");
  unigram["model"]["type"] = "Unigram";
  const TempFile unigram_file("bpe_tokenizer_test_unigram.json", unigram.dump());
  const std::string message = message_of([&] { loom::data::load_tokenizer(unigram_file.path); });
  EXPECT_NE(message.find(unigram_file.path), std::string::npos) << message;
  EXPECT_NE(message.find("\"Unigram\""), std::string::npos) << message;
  EXPECT_NE(message_of([] { loom::data::load_tokenizer("vocab.txt"); }).find("vocab.txt"), std::string::npos);
}
