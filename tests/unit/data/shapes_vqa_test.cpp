// Shapes VQA: determinism, answers re-derived from the drawn pixels, type weights and split disjointness.
#include "loom/data/synth/shapes_vqa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <thread>

#include "data_test_util.h"
#include "loom/util/errors.h"

using namespace loom::data;
using loom::test::words_of;

namespace {

// What the pixels of one quadrant show, found without the generator's code.
struct SeenShape {
  std::string shape, color;  // empty when the quadrant is empty
  int blobs = 0, box_width = 0, box_height = 0;
  int gap_x = 0, gap_y = 0;  // pixels between the shape and the board's centre lines
};

const std::array<std::string, 4> kCorner = {"top left", "top right", "bottom left", "bottom right"};

bool foreground(const Image& image, int y, int x) {
  const uint8_t* p = image.pixel(y, x);
  return std::max({p[0], p[1], p[2]}) > 100;
}

// Reads each quadrant: counts 4-connected foreground blobs, classifies the colour from the mean
// RGB and the shape from how much of its bounding box it fills (square 1, circle pi/4, triangle 1/2).
std::array<SeenShape, 4> analyse(const Image& image) {
  std::array<SeenShape, 4> seen;
  const int half = image.width / 2;
  for (int q = 0; q < 4; ++q) {
    const int y0 = (q / 2) * half, x0 = (q % 2) * half;
    std::vector<int> label(half * half, 0);
    int count = 0, ymin = half, ymax = -1, xmin = half, xmax = -1;
    double sum[3] = {0, 0, 0};
    for (int y = 0; y < half; ++y) {
      for (int x = 0; x < half; ++x) {
        if (!foreground(image, y0 + y, x0 + x)) continue;
        ++count;
        ymin = std::min(ymin, y), ymax = std::max(ymax, y), xmin = std::min(xmin, x),
        xmax = std::max(xmax, x);
        for (int c = 0; c < 3; ++c) sum[c] += image.pixel(y0 + y, x0 + x)[c];
        if (label[y * half + x]) continue;
        ++seen[q].blobs;
        std::vector<std::pair<int, int>> stack = {{y, x}};
        label[y * half + x] = seen[q].blobs;
        while (!stack.empty()) {
          auto [cy, cx] = stack.back();
          stack.pop_back();
          const int dy[4] = {1, -1, 0, 0}, dx[4] = {0, 0, 1, -1};
          for (int k = 0; k < 4; ++k) {
            const int ny = cy + dy[k], nx = cx + dx[k];
            if (ny < 0 || nx < 0 || ny >= half || nx >= half || label[ny * half + nx]) continue;
            if (!foreground(image, y0 + ny, x0 + nx)) continue;
            label[ny * half + nx] = seen[q].blobs;
            stack.push_back({ny, nx});
          }
        }
      }
    }
    if (count == 0) continue;
    const double r = sum[0] / count, g = sum[1] / count, b = sum[2] / count;
    std::string& color = seen[q].color;
    if (std::min({r, g, b}) > 180)
      color = "white";
    else if (r > 150 && g > 150 && b < 120)
      color = "yellow";
    else if (r > 150 && g < 120 && b < 120)
      color = "red";
    else if (g > 150 && r < 120 && b < 120)
      color = "green";
    else if (b > 150 && r < 120 && g < 150)
      color = "blue";
    else
      color = "unknown";
    seen[q].box_width = xmax - xmin + 1;
    seen[q].box_height = ymax - ymin + 1;
    seen[q].gap_x = q % 2 == 0 ? half - 1 - xmax : xmin;
    seen[q].gap_y = q / 2 == 0 ? half - 1 - ymax : ymin;
    const double fill = static_cast<double>(count) / (seen[q].box_width * seen[q].box_height);
    seen[q].shape = fill > 0.93 ? "square" : fill > 0.65 ? "circle" : "triangle";
  }
  return seen;
}

const std::vector<std::string> kShapeWords = {"circle", "square", "triangle"};
const std::vector<std::string> kColorWords = {"red", "green", "blue", "yellow", "white"};
const std::vector<std::string> kNumbers = {"zero", "one", "two", "three", "four"};

std::string find_word(const std::string& question, const std::vector<std::string>& options) {
  std::string found;
  for (const std::string& w : words_of(question))
    if (std::find(options.begin(), options.end(), w) != options.end()) found = w;
  return found;
}

// The answer the drawn scene gives to the question, worked out from the pixels alone.
std::string expected_answer(const std::string& type, const std::string& question,
                            const std::array<SeenShape, 4>& seen) {
  const std::string shape = find_word(question, kShapeWords), color = find_word(question, kColorWords);
  auto matching = [&](bool by_shape, bool by_color) {
    std::vector<int> qs;
    for (int q = 0; q < 4; ++q)
      if (!seen[q].shape.empty() && (!by_shape || seen[q].shape == shape) &&
          (!by_color || seen[q].color == color))
        qs.push_back(q);
    return qs;
  };
  if (type == "count") return kNumbers[matching(false, !color.empty()).size()];
  std::vector<int> qs = type == "color"   ? matching(true, false)
                        : type == "shape" ? matching(false, true)
                                          : matching(!shape.empty(), !color.empty());
  if (qs.size() != 1) return "<ambiguous>";
  const SeenShape& s = seen[qs[0]];
  // A position answer restates the name the question used, then the corner.
  return type == "color"   ? s.color
         : type == "shape" ? s.shape
                           : (color.empty() ? shape : color) + " " + kCorner[qs[0]];
}

std::string scene_key(const std::array<SeenShape, 4>& seen) {
  std::string key;
  for (const SeenShape& s : seen) key += (s.shape.empty() ? "-" : s.color + " " + s.shape) + "|";
  return key;
}

}  // namespace

TEST(ShapesVqa, SameIndexGivesSameBytesAcrossObjectsOrderAndThreads) {
  const ShapesVqa a(7, 56), b(7, 56);
  std::vector<VqaSample> from_thread(20);
  std::thread worker([&] {
    for (int i = 19; i >= 0; --i) from_thread[i] = b.sample(Split::train, i);
  });
  worker.join();
  for (int i = 0; i < 20; ++i) {
    const VqaSample s = a.sample(Split::train, i);
    EXPECT_EQ(s.image.rgb, from_thread[i].image.rgb) << i;
    EXPECT_EQ(s.question, from_thread[i].question);
    EXPECT_EQ(s.answer, from_thread[i].answer);
    EXPECT_EQ(s.question_type, from_thread[i].question_type);
    EXPECT_EQ(s.image.rgb, a.sample(Split::train, i).image.rgb);
  }
}

TEST(ShapesVqa, DifferentIndicesSeedsAndSplitsDiffer) {
  const ShapesVqa a(7, 56), b(8, 56);
  std::set<std::vector<uint8_t>> images;
  for (int i = 0; i < 100; ++i) images.insert(a.sample(Split::train, i).image.rgb);
  EXPECT_EQ(images.size(), 100u);
  int same = 0;
  for (int i = 0; i < 20; ++i) {
    same += a.sample(Split::train, i).image.rgb == b.sample(Split::train, i).image.rgb;
    same += a.sample(Split::train, i).image.rgb == a.sample(Split::eval, i).image.rgb;
  }
  EXPECT_EQ(same, 0);
}

TEST(ShapesVqa, EveryAnswerMatchesTheDrawnScene) {
  for (int64_t size : {56, 112}) {
    const ShapesVqa data(3, size);
    for (Split split : {Split::train, Split::eval}) {
      for (int i = 0; i < 500; ++i) {
        const VqaSample s = data.sample(split, i);
        ASSERT_EQ(s.image.height, size);
        ASSERT_EQ(s.image.width, size);
        ASSERT_EQ(s.image.rgb.size(), static_cast<size_t>(size * size * 3));
        const auto seen = analyse(s.image);
        int shapes = 0;
        for (const SeenShape& q : seen) {
          if (q.shape.empty()) continue;
          ++shapes;
          EXPECT_EQ(q.blobs, 1);
          EXPECT_NE(q.color, "unknown");
          // Size is 50-70% of the quadrant side (a circle's or triangle's drawn extent may lose a
          // pixel), against the board's centre lines: at most 2 pixels off each (3 for a circle's
          // lost pixel).
          const int half = size / 2;
          EXPECT_GE(std::max(q.box_width, q.box_height), half * 50 / 100 - 1);
          EXPECT_LE(std::max(q.box_width, q.box_height), half * 70 / 100);
          EXPECT_LE(q.gap_x, 3);
          EXPECT_LE(q.gap_y, 3);
          EXPECT_GE(std::min(q.gap_x, q.gap_y), 0);
        }
        EXPECT_GE(shapes, 1);
        EXPECT_EQ(s.answer, expected_answer(s.question_type, s.question, seen))
            << "sample " << i << ": " << s.question << " -> " << s.answer << " scene " << scene_key(seen);
      }
    }
  }
}

TEST(ShapesVqa, QuestionTypesFollowTheirWeights) {
  const ShapesVqa data(11, 56);
  std::map<std::string, int> counts;
  std::map<std::string, std::set<std::string>> answers;
  for (int i = 0; i < 2000; ++i) {
    const VqaSample s = data.sample(Split::train, i);
    ++counts[s.question_type];
    answers[s.question_type].insert(s.answer);
  }
  ASSERT_EQ(ShapesVqa::question_types(), (std::vector<std::string>{"color", "shape", "count", "position"}));
  // Position questions come 2 in 5, the other types 1 in 5 each.
  for (const std::string& type : ShapesVqa::question_types()) {
    EXPECT_NEAR(counts[type], type == "position" ? 800 : 400, 60) << type;
  }
  EXPECT_EQ(answers["color"].size(), 5u);
  EXPECT_EQ(answers["shape"].size(), 3u);
  EXPECT_EQ(answers["count"].size(), 5u);
  // Position answers: each of the 8 names (5 colours, 3 shapes) with each of the 4 corners.
  std::set<std::string> corners;
  for (const std::string& answer : answers["position"]) {
    const auto words = words_of(answer);
    ASSERT_EQ(words.size(), 3u) << answer;
    corners.insert(words[1] + " " + words[2]);
  }
  EXPECT_EQ(corners.size(), 4u);
  EXPECT_EQ(answers["position"].size(), 32u);
}

TEST(ShapesVqa, TrainAndEvalNeverShareAScene) {
  std::set<std::string> train, eval;
  for (uint64_t seed : {1, 2}) {
    const ShapesVqa data(seed, 56);
    for (int i = 0; i < 2000; ++i) train.insert(scene_key(analyse(data.sample(Split::train, i).image)));
    for (int i = 0; i < 1000; ++i) eval.insert(scene_key(analyse(data.sample(Split::eval, i).image)));
  }
  EXPECT_GT(train.size(), 500u);
  EXPECT_GT(eval.size(), 200u);
  for (const std::string& scene : eval) EXPECT_EQ(train.count(scene), 0u) << scene;
}

TEST(ShapesVqa, VocabularyCoversEveryWord) {
  const std::vector<std::string> vocab = ShapesVqa::vocabulary();
  const std::set<std::string> unique(vocab.begin(), vocab.end());
  EXPECT_EQ(unique.size(), vocab.size());
  for (const auto* list : {&kShapeWords, &kColorWords, &kNumbers})
    for (const std::string& w : *list) EXPECT_EQ(unique.count(w), 1u) << w;
  for (const char* w : {"?", "top", "bottom", "left", "right"}) EXPECT_EQ(unique.count(w), 1u) << w;
  std::set<std::string> used;
  const ShapesVqa data(5, 56);
  for (Split split : {Split::train, Split::eval}) {
    for (int i = 0; i < 2000; ++i) {
      const VqaSample s = data.sample(split, i);
      for (const std::string& w : words_of(s.question + " " + s.answer)) {
        EXPECT_EQ(unique.count(w), 1u) << w;
        EXPECT_EQ(w, [&] {
          std::string lower = w;
          std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
          return lower;
        }());
        used.insert(w);
      }
      EXPECT_EQ(s.question.back(), '?');
      EXPECT_EQ(s.question.substr(s.question.size() - 2), " ?");
    }
  }
  EXPECT_EQ(used, unique);  // and no word in the vocabulary is unused
}

TEST(ShapesVqa, RejectsBadSizeAndIndex) {
  EXPECT_THROW(ShapesVqa(1, 50), loom::ConfigError);
  EXPECT_THROW(ShapesVqa(1, 0), loom::ConfigError);
  EXPECT_THROW(ShapesVqa(1, 56).sample(Split::train, -1), loom::DataError);
}
