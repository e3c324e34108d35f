#include "loom/train/loss_plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>

#include "../checkpoint/temp_dir.h"
#include "loom/data/image/decode.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;
using checkpoint::testing::TempDir;
using checkpoint::testing::write_bytes;

const std::array<uint8_t, 3> kBlue{31, 119, 180}, kOrange{255, 127, 14};

int64_t count_pixels(const data::Image& image, const std::array<uint8_t, 3>& colour) {
  int64_t n = 0;
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) n += std::equal(colour.begin(), colour.end(), image.pixel(y, x));
  return n;
}

TEST(LossPlot, ReadsTheTrainLossFirstThenEveryOtherLossByName) {
  TempDir dir;
  write_bytes(dir.file("metrics.jsonl"),
              "{\"step\":1,\"loss\":2.0,\"lr\":0.1}\n"
              "{\"step\":2,\"loss\":1.5}\n"
              "{\"step\":2,\"eval_accuracy\":0.5,\"eval_loss\":1.75}\n"
              "{\"step\":2,\"aux_loss\":0.25}\n"
              "not json\n"
              "{\"loss\":9.0}\n"
              "{\"step\":3,\"loss\":null}\n"
              "{\"step\":1,\"loss\":1.25}\n"  // a step logged again keeps its later value
              "{\"step\":4,\"loss\":1.0");    // cut short by a crash
  const auto series = read_loss_series(dir.file("metrics.jsonl"));
  ASSERT_EQ(series.size(), 3u);
  EXPECT_EQ(series[0].name, "loss");
  EXPECT_EQ(series[0].values, (std::map<int64_t, double>{{1, 1.25}, {2, 1.5}}));
  EXPECT_EQ(series[1].name, "aux_loss");
  EXPECT_EQ(series[2].name, "eval_loss");
  EXPECT_EQ(series[2].values, (std::map<int64_t, double>{{2, 1.75}}));
  EXPECT_TRUE(read_loss_series(dir.file("missing.jsonl")).empty());
}

TEST(LossPlot, DrawsEachSeriesInItsColourOnWhite) {
  std::map<int64_t, double> train, eval;
  for (int64_t step = 1; step <= 100; ++step) train[step] = 3.0 / step;
  eval[50] = 0.5;
  eval[100] = 0.25;
  const data::Image chart = draw_loss_chart({{"loss", train}, {"eval_loss", eval}});
  EXPECT_EQ(chart.width, 640);
  EXPECT_EQ(chart.height, 400);
  EXPECT_EQ(chart.pixel(0, 0)[0], 255);  // a white margin
  EXPECT_EQ(chart.pixel(399, 639)[2], 255);
  // The train line is long; the eval line is short, with a square at each of its points and a
  // swatch in the legend (5x5 + 5x5 + 12x10 at least).
  EXPECT_GT(count_pixels(chart, kBlue), 1000);
  EXPECT_GT(count_pixels(chart, kOrange), 25 + 25 + 120);
  const data::Image empty = draw_loss_chart({});  // axes only
  EXPECT_EQ(count_pixels(empty, kBlue), 0);
  EXPECT_GT(count_pixels(empty, {0, 0, 0}), 500);
}

TEST(LossPlot, WritesAPngOnlyWhenThereIsALoss) {
  TempDir dir;
  write_bytes(dir.file("metrics.jsonl"), "{\"step\":1,\"loss\":2.0}\n{\"step\":2,\"loss\":1.0}\n");
  ASSERT_TRUE(write_loss_plot(dir.file("metrics.jsonl"), dir.file("loss.png")));
  const data::Image image = data::decode_image_file(dir.file("loss.png"));
  EXPECT_EQ(image.width, 640);
  EXPECT_EQ(image.height, 400);
  EXPECT_GT(count_pixels(image, kBlue), 100);
  EXPECT_FALSE(fs::exists(dir.file("loss.png.tmp")));

  write_bytes(dir.file("none.jsonl"), "{\"step\":1,\"eval_accuracy\":0.5}\n");
  EXPECT_FALSE(write_loss_plot(dir.file("none.jsonl"), dir.file("none.png")));
  EXPECT_FALSE(fs::exists(dir.file("none.png")));
}

}  // namespace
}  // namespace loom::train
