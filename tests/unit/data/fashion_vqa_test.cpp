// Fashion VQA: the real Fashion-MNIST files of the dataset-fashion-mnist package (installed by
// scripts/setup.sh) checked against published facts and bytes read by an independent script, and
// tiny hand-made directories (tests/fixtures/idx/make.py) for exact bytes and errors.
#include "loom/data/fashion_vqa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "data_test_util.h"
#include "loom/util/errors.h"

using namespace loom::data;
using loom::test::message_of;
using loom::test::says_all;
using loom::test::words_of;

namespace {

std::string fixture_dir(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/idx/fashion/" + name;
}

// The real dataset, loaded once for the whole test binary. Its absence is a failed setup, not a skip.
const FashionVqa& real() {
  static const FashionVqa vqa = [] {
    const std::string dir = FashionMnist::kDefaultDir;
    if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) {
      ADD_FAILURE() << "Fashion-MNIST not found in " << dir
                    << ": run scripts/setup.sh (package dataset-fashion-mnist)";
    }
    return FashionVqa(dir, 1234);
  }();
  return vqa;
}

// Loads split "train" of fixture directory `name`, expecting a DataError containing every one of `parts`.
void expect_load_error(const std::string& name, const std::vector<std::string>& parts) {
  EXPECT_TRUE(says_all(message_of([&] { FashionMnist(fixture_dir(name), "train"); }), parts)) << name;
}

}  // namespace

TEST(FashionVqaReal, Sizes) {
  EXPECT_EQ(real().size(Split::train), 60000);
  EXPECT_EQ(real().size(Split::eval), 10000);
}

TEST(FashionVqaReal, TestSplitHasExactlyAThousandPerClass) {
  std::map<std::string, int> histogram;
  for (int64_t i = 0; i < real().size(Split::eval); ++i) ++histogram[real().sample(Split::eval, i).answer];
  ASSERT_EQ(histogram.size(), 10u);
  for (const std::string& name : FashionVqa::class_names()) EXPECT_EQ(histogram[name], 1000) << name;
}

// Expected values read with:
//   /usr/bin/python3 -c "import gzip, numpy as np; d='/usr/share/datasets/fashion-mnist/';
//     i=np.frombuffer(gzip.open(d+'train-images-idx3-ubyte.gz').read(), np.uint8,
//     offset=16).reshape(-1,28,28); l=np.frombuffer(gzip.open(d+'train-labels-idx1-ubyte.gz').read(),
//     np.uint8, offset=8); print(l[:10], i[0][4,15], i[0][14,14], i[0][20,5], i[0][23,20], i[0][0,0],
//     i[0].astype(int).sum())"
// -> [9 0 0 3 0 2 7 2 5 5] 136 217 205 211 0 76247
TEST(FashionVqaReal, FirstTrainingImageIsAnAnkleBoot) {
  const VqaSample s = real().sample(Split::train, 0);
  EXPECT_EQ(s.answer, "ankle boot");
  EXPECT_EQ(s.question_type, "class");
  ASSERT_EQ(s.image.height, 28);
  ASSERT_EQ(s.image.width, 28);
  ASSERT_EQ(s.image.rgb.size(), 28u * 28u * 3u);
  const std::array<std::array<int, 3>, 5> expected = {
      {{4, 15, 136}, {14, 14, 217}, {20, 5, 205}, {23, 20, 211}, {0, 0, 0}}};
  for (const auto& [y, x, value] : expected) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(s.image.pixel(y, x)[c], value) << y << "," << x << " channel " << c;
  }
  int64_t sum = 0;
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x) sum += s.image.pixel(y, x)[0];
  EXPECT_EQ(sum, 76247);
  const std::array<const char*, 10> first_answers = {"ankle boot", "t-shirt", "t-shirt",  "dress",  "t-shirt",
                                                     "pullover",   "sneaker", "pullover", "sandal", "sandal"};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(real().sample(Split::train, i).answer, first_answers[i]) << i;
}

TEST(FashionVqaReal, DeterministicAcrossInstancesAndThreads) {
  const FashionVqa other(FashionMnist::kDefaultDir, 1234);
  for (int64_t i : {0, 1, 777, 59999}) {
    const VqaSample a = real().sample(Split::train, i), b = other.sample(Split::train, i);
    EXPECT_EQ(a.question, b.question);
    EXPECT_EQ(a.answer, b.answer);
    EXPECT_EQ(a.image.rgb, b.image.rgb);
  }
  // Four threads read the same samples at once; each must see what one thread sees.
  std::vector<VqaSample> serial;
  for (int64_t i = 0; i < 200; ++i) serial.push_back(real().sample(Split::eval, i));
  std::vector<std::vector<VqaSample>> seen(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t i = 0; i < 200; ++i) seen[t].push_back(real().sample(Split::eval, i));
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) {
    for (int64_t i = 0; i < 200; ++i) {
      EXPECT_EQ(seen[t][i].question, serial[i].question);
      EXPECT_EQ(seen[t][i].answer, serial[i].answer);
      EXPECT_EQ(seen[t][i].image.rgb, serial[i].image.rgb);
    }
  }
}

TEST(FashionVqaReal, QuestionsVaryAcrossIndexesAndSeeds) {
  std::map<std::string, int> counts;
  for (int64_t i = 0; i < 1000; ++i) ++counts[real().sample(Split::train, i).question];
  EXPECT_EQ(counts.size(), FashionVqa::questions().size());
  for (const auto& [question, count] : counts) {
    EXPECT_NE(std::find(FashionVqa::questions().begin(), FashionVqa::questions().end(), question),
              FashionVqa::questions().end());
    EXPECT_GT(count, 1000 / 5 / 2) << question;  // roughly uniform over the five phrasings
  }
  // Another seed changes phrasings but never the image or the answer.
  const FashionVqa reseeded(FashionMnist::kDefaultDir, 99);
  int differ = 0;
  for (int64_t i = 0; i < 100; ++i) {
    const VqaSample a = real().sample(Split::train, i), b = reseeded.sample(Split::train, i);
    differ += a.question != b.question;
    EXPECT_EQ(a.answer, b.answer);
    EXPECT_EQ(a.image.rgb, b.image.rgb);
  }
  EXPECT_GT(differ, 50);
}

TEST(FashionVqaReal, EveryWordIsInTheVocabulary) {
  const std::vector<std::string> vocab = FashionVqa::vocabulary();
  EXPECT_TRUE(std::is_sorted(vocab.begin(), vocab.end()));
  const std::set<std::string> words(vocab.begin(), vocab.end());
  EXPECT_EQ(words.size(), vocab.size());
  for (const char* w : {"t-shirt", "ankle", "boot", "what", "?", "."}) EXPECT_TRUE(words.count(w)) << w;
  for (Split split : {Split::train, Split::eval}) {
    for (int64_t i = 0; i < 2000; ++i) {
      const VqaSample s = real().sample(split, i);
      for (const std::string& text : {s.question, s.answer})
        for (const std::string& w : words_of(text))
          EXPECT_TRUE(words.count(w)) << w << " in '" << text << "'";
    }
  }
}

TEST(FashionVqaReal, IndexOutOfRange) {
  EXPECT_THROW(real().sample(Split::eval, 10000), loom::DataError);
  EXPECT_THROW(real().sample(Split::train, -1), loom::DataError);
  EXPECT_NO_THROW(real().sample(Split::train, 59999));
}

TEST(FashionVqaFixture, ExactBytesLabelsAndUnzippedFiles) {
  // tests/fixtures/idx/make.py: pixel (i, y, x) = (i * 50 + y * 28 + x) % 256; train labels 9 0 3, t10k 8 1.
  const FashionVqa vqa(fixture_dir("good"), 7);
  ASSERT_EQ(vqa.size(Split::train), 3);
  ASSERT_EQ(vqa.size(Split::eval), 2);
  EXPECT_EQ(vqa.sample(Split::train, 0).answer, "ankle boot");
  EXPECT_EQ(vqa.sample(Split::train, 1).answer, "t-shirt");
  EXPECT_EQ(vqa.sample(Split::train, 2).answer, "dress");
  EXPECT_EQ(vqa.sample(Split::eval, 0).answer, "bag");
  EXPECT_EQ(vqa.sample(Split::eval, 1).answer, "trouser");
  const Image image = vqa.sample(Split::train, 2).image;
  // (2 * 50 + 0) = 100; (100 + 5 * 28 + 3) % 256 = 243; (100 + 27 * 28 + 27) % 256 = 883 % 256 = 115.
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(image.pixel(0, 0)[c], 100);
    EXPECT_EQ(image.pixel(5, 3)[c], 243);
    EXPECT_EQ(image.pixel(27, 27)[c], 115);
  }
  EXPECT_EQ(vqa.sample(Split::eval, 1).image.pixel(0, 1)[2], 51);  // eval image 1: 50 + 1
  EXPECT_THROW(vqa.sample(Split::train, 3), loom::DataError);
}

TEST(FashionVqaFixture, ClassNamesInStandardOrder) {
  EXPECT_EQ(FashionVqa::class_names(),
            (std::vector<std::string>{"t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
                                      "sneaker", "bag", "ankle boot"}));
}

TEST(FashionMnistErrors, NameTheFileAndWhatIsWrong) {
  expect_load_error("count_mismatch", {"train-labels-idx1-ubyte.gz", "3 labels", "2 images"});
  expect_load_error("bad_label", {"train-labels-idx1-ubyte.gz", "label 1 is 10", "0..9"});
  expect_load_error("bad_shape", {"train-images-idx3-ubyte.gz", "[2, 27, 28]", "[N, 28, 28]"});
  expect_load_error("missing_labels", {"train-labels-idx1-ubyte.gz", "not found"});
  expect_load_error("no_such_dir", {"no_such_dir/train-images-idx3-ubyte.gz", "not found"});
  EXPECT_THROW(FashionMnist(fixture_dir("good"), "test"), loom::DataError);
  // The good directory has no t10k failure: its unzipped images file is found without the suffix.
  EXPECT_EQ(FashionMnist(fixture_dir("good"), "t10k").size(), 2);
}
