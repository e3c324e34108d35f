#include "loom/train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <system_error>
#include <vector>

#include "loom/checkpoint/durable_file.h"
#include "loom/util/errors.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// Rewrites `path` keeping the lines whose "step" is <= resume_step. Lines that do not parse (a
// write cut short by a crash) are dropped; lines without a numeric "step" are kept. The new file
// replaces the old one only once it is whole on disk; on any failure the old one stays as it was.
void truncate_after(const fs::path& path, int64_t resume_step) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(fmt::format("metrics log: cannot read {}: {}", path.string(), std::strerror(errno)));
  std::string kept;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) continue;
    const auto step = record.is_object() ? record.find("step") : record.end();
    if (record.is_object() && step != record.end() && step->is_number() && step->get<double>() > resume_step)
      continue;
    kept += line;
    kept += '\n';
  }
  if (in.bad()) throw ConfigError(fmt::format("metrics log: cannot read {}", path.string()));
  in.close();
  try {
    checkpoint::DurableFileWriter out(path.string());  // write, fsync, close, rename: each checked
    out.write(kept.data(), kept.size());
    out.commit();
  } catch (const CheckpointError& e) {
    throw ConfigError(
        fmt::format("metrics log: cannot rewrite {} for the resume at step {} (left as it was): {}",
                    path.string(), resume_step, e.what()));
  }
}

bool ends_without_newline(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() <= 0) return false;
  in.seekg(-1, std::ios::end);
  return in.get() != '\n';
}

}  // namespace

MetricsLog::MetricsLog(const fs::path& output_dir, std::optional<int64_t> resume_step,
                       const std::optional<fs::path>& tensorboard_dir)
    : path_(output_dir / "metrics.jsonl") {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec)
    throw ConfigError(
        fmt::format("metrics log: cannot create output_dir {}: {}", output_dir.string(), ec.message()));
  if (resume_step && fs::exists(path_)) truncate_after(path_, *resume_step);
  const bool needs_newline = ends_without_newline(path_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw ConfigError(
        fmt::format("metrics log: cannot open {} for appending: {}", path_.string(), std::strerror(errno)));
  try {
    if (needs_newline) append("\n");  // end a line cut short, so the next record starts on its own line
    if (tensorboard_dir) tensorboard_.emplace(*tensorboard_dir);
  } catch (...) {
    ::close(fd_);  // no destructor runs for a constructor that throws
    throw;
  }
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);  // every line went out in its own write(): nothing is left to flush
}

void MetricsLog::append(const std::string& text) {
  const char* bytes = text.data();
  size_t size = text.size();
  while (size > 0) {
    const ssize_t written = ::write(fd_, bytes, size);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0)
      throw ConfigError(
          fmt::format("metrics log: cannot append to {}: {}", path_.string(), std::strerror(errno)));
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

void MetricsLog::write(const nlohmann::json& record) {
  append(record.dump() + '\n');
  if (tensorboard_) tensorboard_->write(record);
}

std::optional<fs::path> MetricsLog::tensorboard_path() const {
  if (!tensorboard_) return std::nullopt;
  return tensorboard_->path();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t total = static_cast<int64_t>(seconds);
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  if (h > 0) return fmt::format("{}:{:02d}:{:02d}", h, m, s);
  return fmt::format("{:02d}:{:02d}", m, s);
}

std::string format_rate(double per_second) {
  if (!std::isfinite(per_second)) return "-";
  // Thresholds sit just under each unit so that rounding never prints "1000k".
  if (per_second < 999.5) return fmt::format("{:.0f}", per_second);
  if (per_second < 999.95e3) return fmt::format("{:.1f}k", per_second / 1e3);
  if (per_second < 999.95e6) return fmt::format("{:.1f}M", per_second / 1e6);
  return fmt::format("{:.1f}G", per_second / 1e9);
}

std::string format_progress_line(int64_t step, int64_t total_steps, double loss, double lr,
                                 double tokens_per_s, double samples_per_s, double mfu, double eta_seconds) {
  constexpr int64_t kWidth = 20;
  const int64_t filled =
      total_steps > 0 ? std::clamp<int64_t>(kWidth * step / total_steps, 0, kWidth) : kWidth;
  std::string bar = std::string(filled, '=');
  if (filled < kWidth) bar += '>' + std::string(kWidth - filled - 1, ' ');
  return fmt::format("step {}/{} [{}] loss {:.4f} lr {:.1e} tok/s {} smp/s {} mfu {:.1f}% eta {}", step,
                     total_steps, bar, loss, lr, format_rate(tokens_per_s), format_rate(samples_per_s),
                     100.0 * mfu, format_duration(eta_seconds));
}

ProgressBar::ProgressBar(int64_t total_steps, int64_t log_every, int64_t start_step, std::FILE* stream,
                         Mode mode)
    : total_steps_(total_steps),
      log_every_(std::max<int64_t>(1, log_every)),
      start_step_(start_step),
      stream_(stream),
      redraw_(mode == Mode::redraw || (mode == Mode::automatic && isatty(fileno(stream)))),
      off_(mode == Mode::off) {}

void ProgressBar::update(int64_t step, double loss, double lr, double tokens_per_s, double samples_per_s,
                         double mfu, double seconds_elapsed) {
  if (off_) return;
  const int64_t done = step - start_step_;
  const double eta = done > 0 ? seconds_elapsed / done * std::max<int64_t>(0, total_steps_ - step) : -1.0;
  const std::string line =
      format_progress_line(step, total_steps_, loss, lr, tokens_per_s, samples_per_s, mfu, eta);
  if (redraw_) {
    std::fprintf(stream_, "\r%s\x1b[K", line.c_str());  // ESC[K clears what a longer previous line left
    line_open_ = true;
  } else if (step % log_every_ == 0 || step == total_steps_) {
    std::fprintf(stream_, "%s\n", line.c_str());
  }
  std::fflush(stream_);
}

void ProgressBar::finish() {
  if (line_open_) {
    std::fputc('\n', stream_);
    std::fflush(stream_);
    line_open_ = false;
  }
}

}  // namespace loom::train
