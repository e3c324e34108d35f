#include "loom/train/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../checkpoint/temp_dir.h"
#include "loom/util/errors.h"
#include "loom/util/filesystem.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A folder of its own under this test process's temporary directory (removed at exit).
fs::path scratch_dir(const std::string& name) {
  static const checkpoint::testing::TempDir root;
  return root.path() / name;
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(MetricsLog, AppendsOneJsonObjectPerLine) {
  const fs::path dir = scratch_dir("append");
  {
    MetricsLog log(dir);
    EXPECT_EQ(log.path(), dir / "metrics.jsonl");
    log.write({{"step", 1}, {"loss", 2.5}});
    // Flushed at once: readable while the log is still open.
    EXPECT_EQ(read_lines(dir / "metrics.jsonl"), std::vector<std::string>{R"({"loss":2.5,"step":1})"});
    log.write({{"step", 2}, {"loss", 2.25}, {"lr", 0.001}});
  }
  {
    MetricsLog log(dir);  // no resume step: a second run appends
    log.write({{"step", 3}, {"loss", 2.0}});
  }
  const auto lines = read_lines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], R"({"loss":2.25,"lr":0.001,"step":2})");
  EXPECT_EQ(json::parse(lines[2])["step"], 3);
}

TEST(MetricsLog, ResumeDropsLinesAfterTheResumeStep) {
  const fs::path dir = scratch_dir("resume");
  {
    MetricsLog log(dir);
    log.write({{"event", "start"}});  // no step: always kept
    for (int step = 1; step <= 5; ++step) log.write({{"step", step}, {"loss", 1.0 / step}});
  }
  {
    // Simulate a crash in the middle of writing a line.
    std::ofstream out(dir / "metrics.jsonl", std::ios::app);
    out << R"({"step": 6, "lo)";
  }
  {
    MetricsLog log(dir, 3);  // resumed from the checkpoint of step 3
    auto lines = read_lines(dir / "metrics.jsonl");
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(json::parse(lines[0])["event"], "start");
    EXPECT_EQ(json::parse(lines[3])["step"], 3);
    log.write({{"step", 4}, {"loss", 0.3}});
  }
  const auto lines = read_lines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[4], R"({"loss":0.3,"step":4})");
  EXPECT_FALSE(fs::exists(dir / "metrics.jsonl.tmp"));
}

TEST(MetricsLog, AppendAfterCutLineStartsANewLine) {
  const fs::path dir = scratch_dir("cut");
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1}\n{\"st";
  MetricsLog(dir).write({{"step", 2}});
  const auto lines = read_lines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2], R"({"step":2})");
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `body`, expecting a ConfigError whose message contains every one of `parts`.
template <typename Body>
void expect_config_error(Body body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "expected a ConfigError mentioning '" << parts.front() << "'";
  } catch (const ConfigError& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << e.what() << "' lacks '" << part << "'";
  }
}

// A full disk without one: writes to /dev/full fail with ENOSPC. The rewrite writes its new file
// at DurableFileWriter's temporary path, here a link to /dev/full.
TEST(MetricsLog, RewriteThatCannotBeWrittenKeepsTheOldFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const fs::path dir = scratch_dir("rewrite-full");
  {
    MetricsLog log(dir);
    for (int step = 1; step <= 5; ++step) log.write({{"step", step}, {"loss", 1.0 / step}});
  }
  const fs::path path = dir / "metrics.jsonl";
  const std::string before = read_file(path);
  const fs::path temporary = dir / fmt::format(".metrics.jsonl.tmp-{}", ::getpid());
  fs::create_symlink("/dev/full", temporary);
  expect_config_error([&] { MetricsLog log(dir, 3); },
                      {"cannot rewrite " + path.string(), "left as it was", "No space left on device"});
  EXPECT_EQ(read_file(path), before);
  EXPECT_FALSE(fs::exists(fs::symlink_status(temporary)));  // the link is gone, /dev/full stays
  EXPECT_TRUE(fs::exists("/dev/full"));
  MetricsLog(dir, 3).write({{"step", 4}});  // with room, the same resume goes through
  EXPECT_EQ(read_lines(path).size(), 4u);
}

TEST(MetricsLog, AFailedAppendIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const fs::path dir = scratch_dir("append-full");
  fs::create_directories(dir);
  fs::create_symlink("/dev/full", dir / "metrics.jsonl");
  MetricsLog log(dir);
  expect_config_error(
      [&] {
        log.write({{"step", 1}, {"loss", 2.5}});
      },
      {"cannot append to " + (dir / "metrics.jsonl").string(), "No space left on device"});
}

TEST(Format, Duration) {
  EXPECT_EQ(format_duration(0), "00:00");
  EXPECT_EQ(format_duration(59.9), "00:59");
  EXPECT_EQ(format_duration(201), "03:21");
  EXPECT_EQ(format_duration(3599), "59:59");
  EXPECT_EQ(format_duration(3600 + 2 * 60 + 3), "1:02:03");
  EXPECT_EQ(format_duration(100 * 3600), "100:00:00");
  EXPECT_EQ(format_duration(-1), "--:--");
  EXPECT_EQ(format_duration(std::nan("")), "--:--");
}

TEST(Format, Rate) {
  EXPECT_EQ(format_rate(0), "0");
  EXPECT_EQ(format_rate(310.4), "310");
  EXPECT_EQ(format_rate(999.4), "999");
  EXPECT_EQ(format_rate(999.7), "1.0k");
  EXPECT_EQ(format_rate(12345), "12.3k");
  EXPECT_EQ(format_rate(2.5e6), "2.5M");
  EXPECT_EQ(format_rate(3.21e9), "3.2G");
}

TEST(Format, ProgressLine) {
  EXPECT_EQ(format_progress_line(120, 1000, 0.42314, 9.8e-4, 12345, 310, 0.123, 201),
            "step 120/1000 [==>                 ] loss 0.4231 lr 9.8e-04 tok/s 12.3k smp/s 310 mfu 12.3% eta "
            "03:21");
  EXPECT_EQ(
      format_progress_line(1000, 1000, 0.1, 1e-5, 0, 0, 0, 0),
      "step 1000/1000 [====================] loss 0.1000 lr 1.0e-05 tok/s 0 smp/s 0 mfu 0.0% eta 00:00");
  EXPECT_EQ(format_progress_line(0, 10, 1, 1, 1, 1, 1, -1),
            "step 0/10 [>                   ] loss 1.0000 lr 1.0e+00 tok/s 1 smp/s 1 mfu 100.0% eta --:--");
}

std::string contents(std::FILE* f) {
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += static_cast<char>(c);
  return s;
}

TEST(ProgressBar, LineModePrintsEveryLogEvery) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(5, 2, 0, f);  // a file is not a terminal: plain lines
    for (int step = 1; step <= 5; ++step) bar.update(step, 1.0, 1e-3, 100, 10, 0.5, 2.0 * step);
    bar.finish();
  }
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_EQ(out, format_progress_line(2, 5, 1.0, 1e-3, 100, 10, 0.5, 6) + "\n" +  // 2 s/step, 3 steps left
                     format_progress_line(4, 5, 1.0, 1e-3, 100, 10, 0.5, 2) + "\n" +
                     format_progress_line(5, 5, 1.0, 1e-3, 100, 10, 0.5, 0) + "\n");
}

TEST(ProgressBar, RedrawModeRewritesOneLine) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(10, 5, 8, f, ProgressBar::Mode::redraw);  // resumed at step 8
    bar.update(9, 0.5, 1e-4, 1, 1, 0.1, 3.0);                 // 3 s for one step, 1 left
    bar.update(10, 0.5, 1e-4, 1, 1, 0.1, 6.0);
  }  // destruction ends the line
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_EQ(out, "\r" + format_progress_line(9, 10, 0.5, 1e-4, 1, 1, 0.1, 3) + "\x1b[K" + "\r" +
                     format_progress_line(10, 10, 0.5, 1e-4, 1, 1, 0.1, 0) + "\x1b[K\n");
}

}  // namespace
}  // namespace loom::train
