// Shapes VQA generation: scene sampling, drawing and questions, drawn from a counter-based stream.
#include "loom/data/synth/shapes_vqa.h"

#include <algorithm>
#include <array>

#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::data {
namespace {

const std::vector<std::string> kShapes = {"circle", "square", "triangle"};
const std::vector<std::string> kColors = {"red", "green", "blue", "yellow", "white"};
const std::vector<std::string> kPositions = {"top left", "top right", "bottom left", "bottom right"};
const std::vector<std::string> kCountWords = {"zero", "one", "two", "three", "four"};
const std::vector<std::array<int, 3>> kColorRgb = {
    {215, 40, 40}, {40, 195, 60}, {50, 80, 230}, {230, 215, 45}, {235, 235, 235}};
const std::array<int, 3> kBackgroundRgb = {18, 18, 26};

// Question phrasings; {shape} and {color} are filled from the scene.
const std::vector<std::string> kColorQuestions = {"what color is the {shape} ?",
                                                  "what is the color of the {shape} ?",
                                                  "which color does the {shape} have ?"};
const std::vector<std::string> kShapeQuestions = {"what shape is the {color} object ?",
                                                  "which shape is {color} ?",
                                                  "what is the shape of the {color} object ?"};
const std::vector<std::string> kCountAllQuestions = {"how many shapes are there ?",
                                                     "how many objects are in the image ?"};
const std::vector<std::string> kCountColorQuestions = {"how many {color} shapes are there ?",
                                                       "how many {color} objects are in the image ?"};
const std::vector<std::string> kPositionColorQuestions = {"where is the {color} object ?",
                                                          "in which corner is the {color} shape ?",
                                                          "which part of the image has the {color} object ?"};
const std::vector<std::string> kPositionShapeQuestions = {"where is the {shape} ?",
                                                          "in which corner is the {shape} ?",
                                                          "which part of the image has the {shape} ?"};

constexpr int kQuadrants = 4;
constexpr int kEvalOneIn = 10;  // about a tenth of all scenes belong to the eval split

struct Cell {
  int shape = -1, color = -1;  // indices into kShapes / kColors; shape -1 = empty quadrant
  bool empty() const { return shape < 0; }
};
using Scene = std::array<Cell, kQuadrants>;  // top left, top right, bottom left, bottom right

// The scene's content alone decides its split, so train and eval are disjoint by construction
// and for every seed.
Split split_of(const Scene& scene) {
  uint64_t code = 0;
  for (const Cell& cell : scene) {
    code = code * 16 + (cell.empty() ? 0 : 1 + cell.shape * 5 + cell.color);
  }
  return mix64(code ^ 0x5ca1ab1e0ddba11ULL) % kEvalOneIn == 0 ? Split::eval : Split::train;
}

Scene random_scene(CounterRng& rng) {
  Scene scene;
  do {
    for (Cell& cell : scene) {
      cell = Cell{};
      if (rng.below(5) < 3) cell = Cell{rng.below(3), rng.below(5)};
    }
  } while (std::all_of(scene.begin(), scene.end(), [](const Cell& c) { return c.empty(); }));
  return scene;
}

std::string fill(std::string text, const std::string& key, const std::string& value) {
  const size_t at = text.find(key);
  if (at != std::string::npos) text.replace(at, key.size(), value);
  return text;
}

struct Question {
  std::string question, answer;
};

// Picks a question of the given type that the scene answers unambiguously; false if none.
bool make_question(const std::string& type, const Scene& scene, CounterRng& rng, Question& out) {
  std::vector<int> shape_count(3, 0), color_count(5, 0);
  int total = 0;
  for (const Cell& cell : scene) {
    if (cell.empty()) continue;
    ++shape_count[cell.shape];
    ++color_count[cell.color];
    ++total;
  }
  std::vector<int> choices;
  if (type == "color") {
    for (int q = 0; q < kQuadrants; ++q)
      if (!scene[q].empty() && shape_count[scene[q].shape] == 1) choices.push_back(q);
    if (choices.empty()) return false;
    const Cell& cell = scene[choices[rng.below(choices.size())]];
    out.question = fill(kColorQuestions[rng.below(kColorQuestions.size())], "{shape}", kShapes[cell.shape]);
    out.answer = kColors[cell.color];
  } else if (type == "shape") {
    for (int q = 0; q < kQuadrants; ++q)
      if (!scene[q].empty() && color_count[scene[q].color] == 1) choices.push_back(q);
    if (choices.empty()) return false;
    const Cell& cell = scene[choices[rng.below(choices.size())]];
    out.question = fill(kShapeQuestions[rng.below(kShapeQuestions.size())], "{color}", kColors[cell.color]);
    out.answer = kShapes[cell.shape];
  } else if (type == "count") {
    if (rng.below(2) == 0) {
      out.question = kCountAllQuestions[rng.below(kCountAllQuestions.size())];
      out.answer = kCountWords[total];
    } else {
      // Half the time ask about a colour that is present, so "zero" does not dominate.
      int color = rng.below(5);
      if (rng.below(2) == 0) {
        std::vector<int> present;
        for (const Cell& cell : scene)
          if (!cell.empty()) present.push_back(cell.color);
        color = present[rng.below(present.size())];
      }
      out.question =
          fill(kCountColorQuestions[rng.below(kCountColorQuestions.size())], "{color}", kColors[color]);
      out.answer = kCountWords[color_count[color]];
    }
  } else {  // position
    // Name the object by its colour or by its shape, whichever the scene makes unique. The answer
    // restates that name before the corner ("red top left"), so the token that predicts the corner
    // is the name itself and can look the object up among the image tokens in one step; a tiny
    // model given only "top left" kept answering from the bag of image tokens (about 45% with
    // several objects in the scene, 100% with one).
    const bool by_color = rng.below(2) == 0;
    for (int q = 0; q < kQuadrants; ++q) {
      const Cell& cell = scene[q];
      if (!cell.empty() && (by_color ? color_count[cell.color] : shape_count[cell.shape]) == 1)
        choices.push_back(q);
    }
    if (choices.empty()) return false;
    const int q = choices[rng.below(choices.size())];
    if (by_color) {
      out.question = fill(kPositionColorQuestions[rng.below(kPositionColorQuestions.size())], "{color}",
                          kColors[scene[q].color]);
    } else {
      out.question = fill(kPositionShapeQuestions[rng.below(kPositionShapeQuestions.size())], "{shape}",
                          kShapes[scene[q].shape]);
    }
    out.answer = (by_color ? kColors[scene[q].color] : kShapes[scene[q].shape]) + " " + kPositions[q];
  }
  return true;
}

uint8_t clamp_u8(int v) { return static_cast<uint8_t>(std::min(255, std::max(0, v))); }

// Adds per-pixel noise in [-amplitude, amplitude] to every channel.
void draw_noise(Image& image, CounterRng& rng, int amplitude) {
  const int span = 2 * amplitude + 1;
  for (size_t i = 0; i < image.rgb.size(); i += 3) {
    const uint64_t bits = rng.next();
    for (int c = 0; c < 3; ++c) {
      const int noise = static_cast<int>((bits >> (16 * c)) % span) - amplitude;
      image.rgb[i + c] = clamp_u8(image.rgb[i + c] + noise);
    }
  }
}

// Is pixel (u, v) of a side x side box inside the shape? Integer tests on pixel centres.
bool covers(int shape, int u, int v, int side) {
  const int dx = 2 * u + 1 - side, dy = 2 * v + 1 - side;
  switch (shape) {
    case 0:  // circle inscribed in the box
      return dx * dx + dy * dy <= side * side;
    case 1:  // square filling the box
      return true;
    default:  // triangle: apex at the top middle, base along the bottom edge
      return 2 * std::abs(dx) <= 2 * v + 1;
  }
}

// Draws one shape inside quadrant q: size 50-70% of the quadrant side, against the board's centre
// (up to kCentreGap pixels off each centre line). The shapes are grouped around the centre, so
// which of its image token's patches a shape covers tells its quadrant: the vision tower sees no
// absolute position (2D RoPE only) and, with 4 image tokens, the LLM's M-RoPE steps of one row or
// column barely turn its rotary phases (0.1 rad at most at theta 10000), so the quadrant must show
// in the picture itself.
constexpr int kCentreGap = 2;

void draw_shape(Image& image, int q, const Cell& cell, CounterRng& rng) {
  const int half = image.width / 2;
  const int side = rng.between(half * 50 / 100, half * 70 / 100);
  const int gap_x = rng.between(0, kCentreGap), gap_y = rng.between(0, kCentreGap);
  const int x0 = q % 2 == 0 ? half - side - gap_x : half + gap_x;
  const int y0 = q / 2 == 0 ? half - side - gap_y : half + gap_y;
  std::array<uint8_t, 3> rgb;
  for (int c = 0; c < 3; ++c) rgb[c] = clamp_u8(kColorRgb[cell.color][c] + rng.between(-12, 12));
  for (int v = 0; v < side; ++v) {
    for (int u = 0; u < side; ++u) {
      if (!covers(cell.shape, u, v, side)) continue;
      uint8_t* p = image.pixel(y0 + v, x0 + u);
      std::copy(rgb.begin(), rgb.end(), p);
    }
  }
}

// The board's quadrants carry faint, distinct background tints (all far darker than any shape): a
// second landmark for position questions, as a real scene has. Alone they were not enough for the
// tiny model (the shapes hid most of them); the layout around the centre is.
const std::array<std::array<int, 3>, 4> kQuadrantTint = {{{22, 0, 0}, {0, 22, 0}, {0, 0, 22}, {18, 18, 0}}};

Image draw_scene(const Scene& scene, int size, CounterRng& rng) {
  std::array<int, 3> jitter;
  for (int c = 0; c < 3; ++c) jitter[c] = rng.between(-6, 6);
  Image image = Image::filled(size, size, 0, 0, 0);
  const int half = size / 2;
  for (int y = 0; y < size; ++y)
    for (int x = 0; x < size; ++x) {
      const auto& tint = kQuadrantTint[(y / half) * 2 + x / half];
      for (int c = 0; c < 3; ++c) image.pixel(y, x)[c] = clamp_u8(kBackgroundRgb[c] + tint[c] + jitter[c]);
    }
  for (int q = 0; q < kQuadrants; ++q)
    if (!scene[q].empty()) draw_shape(image, q, scene[q], rng);
  draw_noise(image, rng, 6);
  return image;
}

}  // namespace

ShapesVqa::ShapesVqa(uint64_t seed, int64_t image_size) : seed_(seed), image_size_(image_size) {
  if (image_size <= 0 || image_size % 28 != 0 || image_size > 28 * 64) {
    throw ConfigError(fmt::format("shapes_vqa image_size must be a positive multiple of 28 up to {}, got {}",
                                  28 * 64, image_size));
  }
}

const std::vector<std::string>& ShapesVqa::question_types() {
  static const std::vector<std::string> types = {"color", "shape", "count", "position"};
  return types;
}

std::vector<std::string> ShapesVqa::vocabulary() {
  return vocabulary_of({&kColorQuestions, &kShapeQuestions, &kCountAllQuestions, &kCountColorQuestions,
                        &kPositionColorQuestions, &kPositionShapeQuestions, &kShapes, &kColors, &kPositions,
                        &kCountWords});
}

VqaSample ShapesVqa::sample(Split split, int64_t index) const {
  if (index < 0) throw DataError(fmt::format("shapes_vqa sample index must be >= 0, got {}", index));
  CounterRng rng(seed_, split == Split::train ? 0 : 1, static_cast<uint64_t>(index));
  // Position questions come twice as often as each other type (2 in 5): a tiny model learns them last.
  const std::string& type = question_types()[std::min(rng.below(5), 3)];
  // Resample the scene until it belongs to the requested split and admits a question of the
  // chosen type; each try succeeds with probability above 1/20, so the bound is never reached.
  for (int attempt = 0; attempt < 100000; ++attempt) {
    const Scene scene = random_scene(rng);
    if (split_of(scene) != split) continue;
    Question question;
    if (!make_question(type, scene, rng, question)) continue;
    return VqaSample{draw_scene(scene, static_cast<int>(image_size_), rng), question.question,
                     question.answer, type};
  }
  throw DataError(fmt::format("shapes_vqa could not build sample {} of type {}", index, type));
}

}  // namespace loom::data
