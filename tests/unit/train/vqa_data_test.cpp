// The job's built-in data: Fashion-MNIST epochs are permutations of the training split, and the
// limits (held-out size, max_seq_len) are errors that name what is wrong.
#include "loom/train/vqa_data.h"

#include <gtest/gtest.h>

#include <map>

#include "loom/util/errors.h"

namespace loom::train {
namespace {

config::DataSection fashion(int64_t eval_samples = 100) {
  config::DataSection d;
  d.dataset = "fashion_mnist";
  d.image_size = 28;
  d.eval_samples = eval_samples;
  return d;
}

std::vector<std::string> answers(const VqaData& data, int64_t begin, int64_t end) {
  std::vector<std::string> out;
  for (const auto& ex : data.train_examples(begin, end)) out.push_back(ex.answer);
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
  const VqaData data(fashion(), 7);
  for (int64_t epoch : {0, 1}) {
    const auto counts = answer_counts(data, epoch * 60000, (epoch + 1) * 60000);
    ASSERT_EQ(counts.size(), 10u);
    for (const auto& [answer, n] : counts) EXPECT_EQ(n, 6000) << answer << " in epoch " << epoch;
  }
  // Each epoch has its own order, and the same seed gives the same order.
  EXPECT_NE(answers(data, 0, 100), answers(data, 60000, 60100));
  EXPECT_EQ(answers(data, 192, 256), answers(VqaData(fashion(), 7), 192, 256));
  EXPECT_NE(answers(data, 192, 256), answers(VqaData(fashion(), 8), 192, 256));
}

TEST(VqaData, FashionImagesAreProcessedAtImageSize) {
  const auto examples = VqaData(fashion(), 1).train_examples(0, 2);
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].images.at(0).grid_thw, (std::array<int64_t, 3>{1, 2, 2}));  // 28 px / patch 14
  auto d = fashion();
  d.image_size = 56;  // the 28 px photo is scaled up to 56 px: 4 x 4 patches
  EXPECT_EQ(VqaData(d, 1).train_examples(0, 1).at(0).images.at(0).grid_thw,
            (std::array<int64_t, 3>{1, 4, 4}));
}

TEST(VqaData, LimitsAreErrorsNamingTheKey) {
  try {
    VqaData(fashion(10001), 1);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "data.eval_samples: 10001 is more than the 10000 held-out samples of fashion_mnist");
  }
  auto d = fashion();
  d.max_seq_len = 8;
  const VqaData data(d, 1);
  try {
    data.eval_prompts(0, 1);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("held-out sample 0 has "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("more than data.max_seq_len 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::train
