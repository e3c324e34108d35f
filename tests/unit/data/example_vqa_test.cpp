// VQA examples: exact chat-template token layout, label mask, and batch collation.
#include <gtest/gtest.h>

#include "loom/data/example.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/util/errors.h"

using namespace loom::data;

namespace {

// ids: specials 0..7, then user 8, assistant 9, what 10, color 11, is 12, the 13, circle 14,
// ? 15, red 16, where 17, top 18, left 19.
WordTokenizer tokenizer() {
  return WordTokenizer::from_words(
      {"user", "assistant", "what", "color", "is", "the", "circle", "?", "red", "where", "top", "left"});
}

VqaSample sample(int size, const std::string& question, const std::string& answer, const std::string& type) {
  return VqaSample{Image::filled(size, size, 200, 30, 30), question, answer, type};
}

}  // namespace

TEST(VqaExample, ChatTemplateLayoutAndLabels) {
  const WordTokenizer tok = tokenizer();
  const TokenizedExample ex = build_vqa_example(tok, sample(56, "what color is the circle ?", "red", "color"),
                                                Qwen2VLImageProcessor(Qwen2VLImageOptions{}), true);
  // A 56x56 image is 4x4 patches of 14, merged 2x2 into 4 tokens.
  const std::vector<int64_t> expected = {1, 8, 3, 5, 5, 5, 5, 4, 10, 11, 12, 13, 14, 15, 2, 1, 9, 16, 2};
  EXPECT_EQ(ex.input_ids, expected);
  EXPECT_EQ(ex.prompt_length, 17);
  std::vector<int64_t> labels(17, -100);
  labels.push_back(16);
  labels.push_back(2);
  EXPECT_EQ(ex.labels, labels);
  EXPECT_EQ(tok.decode(ex.input_ids),
            "<|im_start|> user <|vision_start|> <|image_pad|> <|image_pad|> <|image_pad|> <|image_pad|> "
            "<|vision_end|> what color is the circle ? <|im_end|> <|im_start|> assistant red <|im_end|>");
  EXPECT_EQ(ex.images.at(0).grid_thw, (std::array<int64_t, 3>{1, 4, 4}));
  EXPECT_EQ(ex.images.at(0).pixel_values.sizes(), (std::vector<int64_t>{16, 1176}));
  EXPECT_EQ(ex.answer, "red");
  EXPECT_EQ(ex.question_type, "color");
}

TEST(VqaExample, PromptOnlyWithoutAnswer) {
  const WordTokenizer tok = tokenizer();
  const TokenizedExample ex = build_vqa_example(tok, sample(56, "what color is the circle ?", "red", "color"),
                                                Qwen2VLImageProcessor(Qwen2VLImageOptions{}), false);
  EXPECT_EQ(ex.input_ids, (std::vector<int64_t>{1, 8, 3, 5, 5, 5, 5, 4, 10, 11, 12, 13, 14, 15, 2, 1, 9}));
  EXPECT_EQ(ex.prompt_length, 17);
  EXPECT_EQ(ex.labels, std::vector<int64_t>(17, -100));
  EXPECT_EQ(ex.answer, "red");
}

TEST(VqaExample, ImagePadCountFollowsTheGrid) {
  const WordTokenizer tok = tokenizer();
  // 112x112 -> 8x8 patches -> 16 merged tokens.
  const TokenizedExample ex =
      build_vqa_example(tok, sample(112, "where is the circle ?", "top left", "position"),
                        Qwen2VLImageProcessor(Qwen2VLImageOptions{}), true);
  EXPECT_EQ(std::count(ex.input_ids.begin(), ex.input_ids.end(), 5), 16);
  EXPECT_EQ(ex.images.at(0).grid_thw, (std::array<int64_t, 3>{1, 8, 8}));
  EXPECT_EQ(ex.prompt_length, 3 + 16 + 1 + 5 + 3);
  EXPECT_EQ(std::vector<int64_t>(ex.labels.end() - 3, ex.labels.end()), (std::vector<int64_t>{18, 19, 2}));
}

TEST(VqaExample, TemplateWordsMustBeInTheTokenizer) {
  const WordTokenizer without_roles = WordTokenizer::from_words({"what", "?"});
  EXPECT_THROW(build_vqa_example(without_roles, sample(56, "what ?", "red", "color"),
                                 Qwen2VLImageProcessor(Qwen2VLImageOptions{}), true),
               loom::DataError);
  EXPECT_EQ(chat_template_words(), (std::vector<std::string>{"user", "assistant"}));
}

TEST(Collate, PadsStacksImagesAndCountsTargets) {
  const WordTokenizer tok = tokenizer();
  const TokenizedExample a = build_vqa_example(tok, sample(56, "what color is the circle ?", "red", "color"),
                                               Qwen2VLImageProcessor(Qwen2VLImageOptions{}), true);
  const TokenizedExample b =
      build_vqa_example(tok, sample(112, "where is the circle ?", "top left", "position"),
                        Qwen2VLImageProcessor(Qwen2VLImageOptions{}), true);
  const Batch batch = collate({a, b}, 0);
  const int64_t la = a.input_ids.size(), lb = b.input_ids.size();
  ASSERT_EQ(la, 19);
  ASSERT_EQ(lb, 31);
  EXPECT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{2, 31}));
  EXPECT_EQ(batch.input_ids.scalar_type(), at::kLong);
  EXPECT_EQ(batch.labels.scalar_type(), at::kLong);
  EXPECT_EQ(batch.attention_mask.scalar_type(), at::kLong);
  for (int64_t t = 0; t < 31; ++t) {
    EXPECT_EQ(batch.input_ids[0][t].item<int64_t>(), t < la ? a.input_ids[t] : 0) << t;
    EXPECT_EQ(batch.labels[0][t].item<int64_t>(), t < la ? a.labels[t] : -100) << t;
    EXPECT_EQ(batch.attention_mask[0][t].item<int64_t>(), t < la ? 1 : 0) << t;
    EXPECT_EQ(batch.input_ids[1][t].item<int64_t>(), b.input_ids[t]);
    EXPECT_EQ(batch.labels[1][t].item<int64_t>(), b.labels[t]);
    EXPECT_EQ(batch.attention_mask[1][t].item<int64_t>(), 1);
  }
  EXPECT_EQ(batch.num_target_tokens, 2 + 3);
  EXPECT_EQ(batch.pixel_values.sizes(), (std::vector<int64_t>{16 + 64, 1176}));
  EXPECT_EQ(batch.pixel_values.scalar_type(), at::kFloat);
  EXPECT_TRUE(batch.pixel_values.slice(0, 0, 16).equal(a.images.at(0).pixel_values));
  EXPECT_TRUE(batch.pixel_values.slice(0, 16, 80).equal(b.images.at(0).pixel_values));
  EXPECT_TRUE(batch.image_grid_thw.equal(at::tensor({1, 4, 4, 1, 8, 8}, at::kLong).reshape({2, 3})));
  EXPECT_EQ(batch.answers, (std::vector<std::string>{"red", "top left"}));
  EXPECT_EQ(batch.question_types, (std::vector<std::string>{"color", "position"}));
}

TEST(Collate, UsesTheGivenPadIdAndRejectsEmpty) {
  const WordTokenizer tok = tokenizer();
  const TokenizedExample a = build_vqa_example(tok, sample(56, "what color is the circle ?", "red", "color"),
                                               Qwen2VLImageProcessor(Qwen2VLImageOptions{}), false);
  const TokenizedExample b = build_vqa_example(tok, sample(56, "what color is the circle ?", "red", "color"),
                                               Qwen2VLImageProcessor(Qwen2VLImageOptions{}), true);
  const Batch batch = collate({a, b}, 7);
  EXPECT_EQ(batch.input_ids[0][17].item<int64_t>(), 7);
  EXPECT_EQ(batch.input_ids[0][18].item<int64_t>(), 7);
  EXPECT_EQ(batch.num_target_tokens, 2);
  EXPECT_THROW(collate({}, 0), loom::DataError);
}
