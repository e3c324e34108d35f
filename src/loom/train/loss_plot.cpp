#include "loom/train/loss_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>

#include "loom/data/image/decode.h"
#include "loom/util/errors.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

using Colour = std::array<uint8_t, 3>;
constexpr Colour kBlack{0, 0, 0}, kWhite{255, 255, 255}, kGrid{225, 225, 225}, kText{60, 60, 60},
    kFrame{160, 160, 160};
constexpr std::array<Colour, 5> kSeriesColours{
    {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189}}};

// A 3x5 pixel font: five rows of three pixels, top to bottom, '#' lit. Letters are small capitals
// (a character of either case draws the same); a character without a glyph draws as a space.
struct Glyph {
  char character;
  const char* rows;
};
constexpr Glyph kFont[] = {
    {'0', "### #.# #.# #.# ###"}, {'1', ".#. ##. .#. .#. ###"}, {'2', "##. ..# .#. #.. ###"},
    {'3', "##. ..# .#. ..# ##."}, {'4', "#.# #.# ### ..# ..#"}, {'5', "### #.. ##. ..# ##."},
    {'6', ".## #.. ### #.# ###"}, {'7', "### ..# .#. .#. .#."}, {'8', "### #.# ### #.# ###"},
    {'9', "### #.# ### ..# ##."}, {'.', "... ... ... ... .#."}, {'-', "... ... ### ... ..."},
    {'+', "... .#. ### .#. ..."}, {'_', "... ... ... ... ###"}, {'a', ".#. #.# ### #.# #.#"},
    {'b', "##. #.# ##. #.# ##."}, {'c', ".## #.. #.. #.. .##"}, {'d', "##. #.# #.# #.# ##."},
    {'e', "### #.. ##. #.. ###"}, {'f', "### #.. ##. #.. #.."}, {'g', ".## #.. #.# #.# .##"},
    {'h', "#.# #.# ### #.# #.#"}, {'i', "### .#. .#. .#. ###"}, {'j', "..# ..# ..# #.# .#."},
    {'k', "#.# #.# ##. #.# #.#"}, {'l', "#.. #.. #.. #.. ###"}, {'m', "#.# ### ### #.# #.#"},
    {'n', "##. #.# #.# #.# #.#"}, {'o', ".#. #.# #.# #.# .#."}, {'p', "##. #.# ##. #.. #.."},
    {'q', ".#. #.# #.# ##. .##"}, {'r', "##. #.# ##. #.# #.#"}, {'s', ".## #.. .#. ..# ##."},
    {'t', "### .#. .#. .#. .#."}, {'u', "#.# #.# #.# #.# ###"}, {'v', "#.# #.# #.# #.# .#."},
    {'w', "#.# #.# ### ### #.#"}, {'x', "#.# #.# .#. #.# #.#"}, {'y', "#.# #.# .#. .#. .#."},
    {'z', "### ..# .#. #.. ###"},
};
constexpr int kTextScale = 2;                  // each font pixel is 2x2 image pixels
constexpr int kTextHeight = 5 * kTextScale;    // 10
constexpr int kTextAdvance = 4 * kTextScale;   // 8: three pixels and a gap
constexpr int kTicks = 5;                      // per axis
constexpr size_t kMarkedSeriesMaxPoints = 30;  // sparser series get a square at each point

void fill_rect(data::Image& image, int x0, int y0, int x1, int y1, const Colour& colour) {  // inclusive
  for (int y = std::max(y0, 0); y <= std::min(y1, image.height - 1); ++y)
    for (int x = std::max(x0, 0); x <= std::min(x1, image.width - 1); ++x)
      std::copy(colour.begin(), colour.end(), image.pixel(y, x));
}

void draw_frame(data::Image& image, int x0, int y0, int x1, int y1, const Colour& colour) {
  fill_rect(image, x0, y0, x1, y0, colour);
  fill_rect(image, x0, y1, x1, y1, colour);
  fill_rect(image, x0, y0, x0, y1, colour);
  fill_rect(image, x1, y0, x1, y1, colour);
}

// Bresenham's line, two pixels thick.
void draw_line(data::Image& image, int x0, int y0, int x1, int y1, const Colour& colour) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  for (int error = dx + dy;;) {
    fill_rect(image, x0, y0, x0 + 1, y0 + 1, colour);
    if (x0 == x1 && y0 == y1) break;
    const int twice = 2 * error;
    if (twice >= dy) {
      error += dy;
      x0 += sx;
    }
    if (twice <= dx) {
      error += dx;
      y0 += sy;
    }
  }
}

int text_width(const std::string& text) {
  return text.empty() ? 0 : static_cast<int>(text.size()) * kTextAdvance - kTextScale;
}

// `text` with its top-left corner at (x, y).
void draw_text(data::Image& image, int x, int y, const std::string& text, const Colour& colour) {
  for (const char c : text) {
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto glyph = std::find_if(std::begin(kFont), std::end(kFont),
                                    [lower](const Glyph& g) { return g.character == lower; });
    if (glyph != std::end(kFont))
      for (int row = 0; row < 5; ++row)
        for (int column = 0; column < 3; ++column)
          if (glyph->rows[row * 4 + column] == '#')
            fill_rect(image, x + column * kTextScale, y + row * kTextScale, x + (column + 1) * kTextScale - 1,
                      y + (row + 1) * kTextScale - 1, colour);
    x += kTextAdvance;
  }
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<LossSeries> read_loss_series(const fs::path& metrics_jsonl) {
  std::map<std::string, std::map<int64_t, double>> by_name;
  std::ifstream in(metrics_jsonl);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) continue;  // also a line that does not parse
    const auto step = record.find("step");
    if (step == record.end() || !step->is_number()) continue;
    for (const auto& [name, value] : record.items())
      if (ends_with(name, "loss") && value.is_number() && std::isfinite(value.get<double>()))
        by_name[name][step->get<int64_t>()] = value.get<double>();
  }
  std::vector<LossSeries> series;
  if (const auto train = by_name.find("loss"); train != by_name.end()) {
    series.push_back({train->first, std::move(train->second)});
    by_name.erase(train);
  }
  for (auto& [name, values] : by_name) series.push_back({name, std::move(values)});
  return series;
}

data::Image draw_loss_chart(const std::vector<LossSeries>& series, int width, int height) {
  data::Image image = data::Image::filled(height, width, kWhite[0], kWhite[1], kWhite[2]);
  // The ranges over every point; empty axes from 0 to 1 when there is none.
  int64_t first = std::numeric_limits<int64_t>::max(), last = std::numeric_limits<int64_t>::min();
  double low = std::numeric_limits<double>::infinity(), high = -low;
  for (const LossSeries& s : series)
    for (const auto& [step, value] : s.values) {
      first = std::min(first, step);
      last = std::max(last, step);
      low = std::min(low, value);
      high = std::max(high, value);
    }
  if (first > last) {
    first = 0;
    last = 1;
    low = 0;
    high = 1;
  }
  if (first == last) {  // one step: centre it
    --first;
    ++last;
  }
  const double pad = high > low ? 0.05 * (high - low) : std::max(0.5, 0.1 * std::abs(high));
  low -= pad;
  high += pad;

  std::vector<std::pair<double, std::string>> value_ticks;
  int label_width = 0;
  for (int i = 0; i < kTicks; ++i) {
    const double value = low + (high - low) * i / (kTicks - 1);
    value_ticks.emplace_back(value, fmt::format("{:.3g}", value));
    label_width = std::max(label_width, text_width(value_ticks.back().second));
  }
  // The plot area, inside the axes: value labels on the left, step labels and "step" below.
  const int left = label_width + 14, right = width - 16, top = 12, bottom = height - 36;
  const auto x_of = [&](int64_t step) {
    return left +
           static_cast<int>(std::lround(static_cast<double>(step - first) / (last - first) * (right - left)));
  };
  const auto y_of = [&](double value) {
    return bottom - static_cast<int>(std::lround((value - low) / (high - low) * (bottom - top)));
  };

  for (const auto& [value, label] : value_ticks) {
    const int y = y_of(value);
    fill_rect(image, left, y, right, y, kGrid);
    draw_text(image, left - 6 - text_width(label), y - kTextHeight / 2, label, kText);
  }
  const int64_t intervals = std::min<int64_t>(kTicks - 1, last - first);
  for (int64_t i = 0; i <= intervals; ++i) {
    const int64_t step = first + (last - first) * i / intervals;
    const int x = x_of(step);
    fill_rect(image, x, top, x, bottom, kGrid);
    const std::string label = std::to_string(step);
    draw_text(image, std::clamp(x - text_width(label) / 2, 0, std::max(0, width - text_width(label))),
              bottom + 6, label, kText);
  }
  draw_text(image, (left + right - text_width("step")) / 2, bottom + 22, "step", kText);
  fill_rect(image, left, top, left, bottom, kBlack);
  fill_rect(image, left, bottom, right, bottom, kBlack);

  for (size_t k = 0; k < series.size(); ++k) {
    const Colour& colour = kSeriesColours[k % kSeriesColours.size()];
    const bool marked = series[k].values.size() <= kMarkedSeriesMaxPoints;
    std::optional<std::pair<int, int>> previous;
    for (const auto& [step, value] : series[k].values) {
      const int x = x_of(step), y = y_of(value);
      if (previous) draw_line(image, previous->first, previous->second, x, y, colour);
      if (marked) fill_rect(image, x - 2, y - 2, x + 2, y + 2, colour);
      previous = {x, y};
    }
  }

  // The legend: one row per series, a colour swatch and the name.
  if (!series.empty()) {
    int name_width = 0;
    for (const LossSeries& s : series) name_width = std::max(name_width, text_width(s.name));
    const int row_height = kTextHeight + 6, rows = static_cast<int>(series.size());
    const int box_width = 6 + 12 + 6 + name_width + 6, box_height = 6 + rows * row_height;
    const int x0 = right - 8 - box_width, y0 = top + 8;
    fill_rect(image, x0, y0, x0 + box_width, y0 + box_height, kWhite);
    draw_frame(image, x0, y0, x0 + box_width, y0 + box_height, kFrame);
    for (int k = 0; k < rows; ++k) {
      const int y = y0 + 6 + k * row_height;
      fill_rect(image, x0 + 6, y, x0 + 17, y + kTextHeight - 1, kSeriesColours[k % kSeriesColours.size()]);
      draw_text(image, x0 + 24, y, series[k].name, kText);
    }
  }
  return image;
}

bool write_loss_plot(const fs::path& metrics_jsonl, const fs::path& png) {
  const std::vector<LossSeries> series = read_loss_series(metrics_jsonl);
  if (series.empty()) return false;
  const fs::path temporary = png.string() + ".tmp";
  data::encode_png_file(draw_loss_chart(series), temporary.string());
  std::error_code error;
  fs::rename(temporary, png, error);
  if (error)
    throw DataError(fmt::format("loss plot: cannot rename {} to {}: {}", temporary.string(), png.string(),
                                error.message()));
  return true;
}

}  // namespace loom::train
