// The loss curve of a run (<output_dir>/loss.png), drawn by hand from metrics.jsonl: a line chart
// of every loss series against the step, with axes, tick labels in a 3x5 pixel font and a legend.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loom/data/image/image.h"

namespace loom::train {

struct LossSeries {
  std::string name;
  std::map<int64_t, double> values;  // by step
};

// The series of a metrics.jsonl to plot: each numeric metric whose name ends in "loss" (the
// training "loss" first, then the others, such as an eval loss, by name), finite values only, a
// step logged twice keeping its later value. Lines that do not parse or have no "step" are skipped;
// a missing file gives no series.
std::vector<LossSeries> read_loss_series(const std::filesystem::path& metrics_jsonl);

// The series as a width x height line chart on white: light grey grid lines at 5 ticks per axis,
// labelled with the step and the value, black axes, each series a 2-pixel line (series with at
// most 30 points also get a square at each point) in its colour — blue (31,119,180) for the first,
// then orange (255,127,14), green (44,160,44), red (214,39,40), purple (148,103,189), cycling — and
// a legend box in the top right corner pairing each colour with its name.
data::Image draw_loss_chart(const std::vector<LossSeries>& series, int width = 640, int height = 400);

// Reads the series of `metrics_jsonl` and writes their chart to `png` (through a temporary file
// and a rename, so a reader never sees half a file). Writes nothing and returns false when there is
// no value to plot. Throws DataError when the PNG cannot be written.
bool write_loss_plot(const std::filesystem::path& metrics_jsonl, const std::filesystem::path& png);

}  // namespace loom::train
