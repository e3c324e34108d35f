// Training metrics: a JSON-lines log (<output_dir>/metrics.jsonl) that survives resumes, optionally
// mirrored to a TensorBoard event file, and the one-line console progress bar.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "loom/train/tensorboard.h"

namespace loom::train {

class MetricsLog {
 public:
  // Opens <output_dir>/metrics.jsonl for appending (creating the folder). With `resume_step`, the
  // file is first rewritten keeping only lines whose "step" is <= resume_step (and lines without a
  // "step"), so steps re-run after a resume are not logged twice; the rewrite replaces the file
  // durably (checkpoint::DurableFileWriter), and when any part of it fails the old file stays and a
  // ConfigError names it and the OS reason. With `tensorboard_dir`, every record also goes to a
  // new TensorBoard event file in that folder (TensorBoardWriter).
  explicit MetricsLog(const std::filesystem::path& output_dir,
                      std::optional<int64_t> resume_step = std::nullopt,
                      const std::optional<std::filesystem::path>& tensorboard_dir = std::nullopt);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends `record` (a JSON object) as one line, unbuffered, and writes it to the event file; a
  // failed write is a ConfigError naming the file and the OS reason.
  void write(const nlohmann::json& record);

  const std::filesystem::path& path() const { return path_; }
  // The event file, when there is one.
  std::optional<std::filesystem::path> tensorboard_path() const;

 private:
  void append(const std::string& text);

  std::filesystem::path path_;
  int fd_ = -1;  // metrics.jsonl, opened O_APPEND
  std::optional<TensorBoardWriter> tensorboard_;
};

// "03:21" under an hour, "1:02:03" from an hour on, "--:--" when unknown (negative or not finite).
std::string format_duration(double seconds);
// Compact rate: "310", "12.3k", "4.5M", "1.2G".
std::string format_rate(double per_second);
// The progress line without any terminal control:
// "step 120/1000 [==>                 ] loss 0.4231 lr 9.8e-04 tok/s 12.3k smp/s 310 mfu 12.3% eta 03:21".
// mfu is a fraction (0.123 prints as 12.3%); eta_seconds < 0 prints as "--:--".
std::string format_progress_line(int64_t step, int64_t total_steps, double loss, double lr,
                                 double tokens_per_s, double samples_per_s, double mfu, double eta_seconds);

class ProgressBar {
 public:
  enum class Mode { automatic, redraw, lines, off };

  // `start_step` is the step the run (re)started from, so the eta counts only steps timed in this run.
  // Mode::automatic redraws in place when `stream` is a terminal and prints plain lines otherwise;
  // Mode::off prints nothing (data-parallel ranks other than 0).
  explicit ProgressBar(int64_t total_steps, int64_t log_every = 10, int64_t start_step = 0,
                       std::FILE* stream = stderr, Mode mode = Mode::automatic);
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `step` counts completed steps; seconds_elapsed is the time since start_step. In line mode a
  // line is printed when step is a multiple of log_every and at the last step.
  void update(int64_t step, double loss, double lr, double tokens_per_s, double samples_per_s, double mfu,
              double seconds_elapsed);
  // Ends the redrawn line (if any) with a newline.
  void finish();

 private:
  int64_t total_steps_, log_every_, start_step_;
  std::FILE* stream_;
  bool redraw_, off_;
  bool line_open_ = false;
};

}  // namespace loom::train
