// The job's built-in data: Fashion-MNIST epochs are permutations of the training split, and the
// limits (held-out size, max_seq_len) are errors that name what is wrong.
#include "loom/tasks/vlm_sft/vqa_data.h"

#include <gtest/gtest.h>

#include <map>

#include "loom/data/image/qwen2vl_processor.h"
#include "loom/util/errors.h"

namespace loom::tasks {
namespace {

// The processor of the tiny Qwen2-VL models these sets train (patch 14, merge 2).
std::unique_ptr<data::ImageProcessor> qwen2vl() {
  return std::make_unique<data::Qwen2VLImageProcessor>(data::Qwen2VLImageOptions{});
}

config::DataSection fashion(int64_t eval_samples = 100) {
  config::DataSection d;
  d.dataset = "fashion_mnist";
  d.image_size = 28;
  d.eval_samples = eval_samples;
  return d;
}

std::vector<std::string> answers(const VqaData& data, int64_t begin, int64_t end) {
  std::vector<std::string> out;
  for (const auto& ex : data.train_examples(begin, end).examples) out.push_back(ex.answer);
  return out;
}

std::map<std::string, int> answer_counts(const VqaData& data, int64_t begin, int64_t end) {
  std::map<std::string, int> counts;
  for (const std::string& answer : answers(data, begin, end)) ++counts[answer];
  return counts;
}

// Fashion-MNIST's training split holds exactly 6,000 images of each of its 10 classes, so an
// epoch that visits every image once shows each answer exactly 6,000 times.
TEST(VqaData, FashionEpochsArePermutationsOfTheTrainingSplit) {
  const VqaData data(fashion(), 7, qwen2vl());
  for (int64_t epoch : {0, 1}) {
    const auto counts = answer_counts(data, epoch * 60000, (epoch + 1) * 60000);
    ASSERT_EQ(counts.size(), 10u);
    for (const auto& [answer, n] : counts) EXPECT_EQ(n, 6000) << answer << " in epoch " << epoch;
  }
  // Each epoch has its own order, and the same seed gives the same order.
  EXPECT_NE(answers(data, 0, 100), answers(data, 60000, 60100));
  EXPECT_EQ(answers(data, 192, 256), answers(VqaData(fashion(), 7, qwen2vl()), 192, 256));
  EXPECT_NE(answers(data, 192, 256), answers(VqaData(fashion(), 8, qwen2vl()), 192, 256));
}

TEST(VqaData, FashionImagesAreProcessedAtImageSize) {
  const auto examples = VqaData(fashion(), 1, qwen2vl()).train_examples(0, 2).examples;
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].images.at(0).grid_thw, (std::array<int64_t, 3>{1, 2, 2}));  // 28 px / patch 14
  auto d = fashion();
  d.image_size = 56;  // the 28 px photo is scaled up to 56 px: 4 x 4 patches
  EXPECT_EQ(VqaData(d, 1, qwen2vl()).train_examples(0, 1).examples.at(0).images.at(0).grid_thw,
            (std::array<int64_t, 3>{1, 4, 4}));
}

// data.hflip mirrors about half of the training images, the same ones for the same seed and run
// position, and never a held-out image.
TEST(VqaData, HflipMirrorsHalfTheTrainingImagesAndNoHeldOutOne) {
  auto flipping = fashion();
  flipping.hflip = true;
  const VqaData plain(fashion(), 3, qwen2vl()), flipped(flipping, 3, qwen2vl()),
      again(flipping, 3, qwen2vl());
  const auto a = plain.train_examples(0, 200).examples, b = flipped.train_examples(0, 200).examples,
             c = again.train_examples(0, 200).examples;
  int mirrored = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].answer, b[i].answer);
    EXPECT_TRUE(b[i].images[0].pixel_values.equal(c[i].images[0].pixel_values));
    if (!a[i].images[0].pixel_values.equal(b[i].images[0].pixel_values)) ++mirrored;
  }
  EXPECT_GT(mirrored, 70);
  EXPECT_LT(mirrored, 130);
  EXPECT_TRUE(plain.eval_prompts(0, 20).pixel_values.equal(flipped.eval_prompts(0, 20).pixel_values));
}

// data.shift moves each training image by an offset in [-shift, shift]^2 that the seed and the
// run position decide; every offset occurs, the answer is kept, and held-out images never move.
TEST(VqaData, ShiftMovesTrainingImagesByBoundedOffsets) {
  auto shifting = fashion();
  shifting.shift = 2;
  const VqaData plain(fashion(), 3, qwen2vl()), shifted(shifting, 3, qwen2vl()),
      again(shifting, 3, qwen2vl());
  std::map<std::pair<int, int>, int> offsets;
  for (int64_t i = 0; i < 300; ++i) {
    const data::VqaSample a = plain.sample(data::Split::train, i), b = shifted.sample(data::Split::train, i);
    EXPECT_EQ(a.answer, b.answer);
    EXPECT_EQ(b.image.rgb, again.sample(data::Split::train, i).image.rgb);
    // The offset that reproduces the moved image from the plain one (the first, when a blank
    // margin makes several fit).
    std::pair<int, int> found{99, 99};
    for (int dy = -2; dy <= 2 && found.first == 99; ++dy)
      for (int dx = -2; dx <= 2 && found.first == 99; ++dx) {
        data::Image moved = a.image;
        moved.translate(dx, dy);
        if (moved.rgb == b.image.rgb) found = {dx, dy};
      }
    ASSERT_NE(found.first, 99) << "training sample " << i << " is not a moved copy of the plain image";
    ++offsets[found];
  }
  EXPECT_EQ(offsets.size(), 25u);
  for (int64_t i = 0; i < 20; ++i)
    EXPECT_EQ(plain.sample(data::Split::eval, i).image.rgb, shifted.sample(data::Split::eval, i).image.rgb);
  EXPECT_TRUE(plain.eval_prompts(0, 20).pixel_values.equal(shifted.eval_prompts(0, 20).pixel_values));
}

TEST(VqaData, LimitsAreErrorsNamingTheKey) {
  try {
    VqaData(fashion(10001), 1, qwen2vl());
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "data.eval_samples: 10001 is more than the 10000 held-out samples of fashion_mnist");
  }
  auto d = fashion();
  d.max_seq_len = 8;
  const VqaData data(d, 1, qwen2vl());
  try {
    data.eval_prompts(0, 1);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("held-out sample 0 has "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("more than data.max_seq_len 8"), std::string::npos) << e.what();
  }
}

// Over-long training samples (data.max_seq_len) are dropped, truncated or an error, and counted;
// held-out ones are always an error. Fashion prompts are 13 tokens plus the answer (1 or 2 words
// and <|im_end|>): 15 or 16 tokens.
TEST(VqaData, OverlongTrainingSamplesAreDroppedTruncatedOrAnErrorAndCounted) {
  auto d = fashion();
  const auto full = VqaData(d, 3, qwen2vl()).train_examples(0, 40);
  ASSERT_EQ(full.examples.size(), 40u);
  int64_t long_ones = 0;
  for (const auto& ex : full.examples) long_ones += ex.input_ids.size() > 15;
  ASSERT_GT(long_ones, 0);
  ASSERT_LT(long_ones, 40);

  d.max_seq_len = 15;
  d.overlong = "drop";
  const auto dropped = VqaData(d, 3, qwen2vl()).train_examples(0, 40);
  EXPECT_EQ(dropped.dropped, long_ones);
  EXPECT_EQ(dropped.truncated, 0);
  EXPECT_EQ(static_cast<int64_t>(dropped.examples.size()), 40 - long_ones);
  for (const auto& ex : dropped.examples) EXPECT_LE(ex.input_ids.size(), 15u);

  d.overlong = "truncate";
  const auto cut = VqaData(d, 3, qwen2vl()).train_examples(0, 40);
  EXPECT_EQ(cut.truncated, long_ones);
  EXPECT_EQ(cut.dropped, 0);
  ASSERT_EQ(cut.examples.size(), 40u);
  for (size_t i = 0; i < 40; ++i) {
    const auto& ex = cut.examples[i];
    const auto& whole = full.examples[i];
    const size_t n = std::min<size_t>(whole.input_ids.size(), 15);
    EXPECT_EQ(ex.input_ids, std::vector<int64_t>(whole.input_ids.begin(), whole.input_ids.begin() + n));
    EXPECT_EQ(ex.labels, std::vector<int64_t>(whole.labels.begin(), whole.labels.begin() + n));
    EXPECT_EQ(ex.images.size(), 1u);  // the cut is after the image
  }

  d.overlong = "error";
  try {
    VqaData(d, 3, qwen2vl()).train_examples(0, 40);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("training sample "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("more than data.max_seq_len 15 (data.overlong: error)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::tasks
