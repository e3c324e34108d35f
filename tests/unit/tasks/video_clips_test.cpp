// The user's video datasets (dataset: videos): rows of a dataset file checked one by one, clips and
// images decoded to the configured frames and size, unusable files skipped and counted by kind, an
// unusable held-out file refused by name before training, and micro-batches of one frame count.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../checkpoint/temp_dir.h"
#include "loom/data/image/decode.h"
#include "loom/data/video/gif_writer.h"
#include "loom/data/video/mp4_writer.h"
#include "loom/tasks/video/clips.h"
#include "loom/util/errors.h"

namespace loom::tasks {
namespace {

using checkpoint::testing::TempDir;

// One colour over every pixel of every frame (exact through a GIF).
data::Video uniform_video(int frames, int side, uint8_t r, uint8_t g, uint8_t b, double fps = 8) {
  data::Video video{frames, side, side, fps, {}};
  for (size_t p = 0; p < static_cast<size_t>(frames) * side * side; ++p)
    video.rgb.insert(video.rgb.end(), {r, g, b});
  return video;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

config::DataSection videos_section(const std::string& file, const std::string& eval_file = "") {
  config::DataSection d;
  d.dataset = "videos";
  config::DatasetFile train;
  train.path = file;
  d.datasets = {train};
  if (!eval_file.empty()) {
    config::DatasetFile held_out;
    held_out.path = eval_file;
    d.eval_datasets = {held_out};
  }
  d.frames = 5;
  d.video_size = 32;
  d.fps = 8;
  d.eval_samples = 1000;
  return d;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(CaptionedMedia, RowsOfWrongTypesAreSkippedAsBadSamplesNamingTheProblem) {
  TempDir dir;
  const std::string file = dir.file("videos.jsonl");
  write_text(file,
             "{\"video\": \"a.mp4\", \"caption\": \"a cat\"}\n"
             "{\"image\": \"b.png\", \"caption\": \"\", \"extra\": 1}\n"
             "\n"
             "{\"video\": 3, \"caption\": \"x\"}\n"
             "{\"video\": \"a.mp4\", \"caption\": [\"x\"]}\n"
             "{\"video\": \"a.mp4\", \"image\": \"b.png\", \"caption\": \"x\"}\n"
             "{\"caption\": \"x\"}\n"
             "\"a string\"\n"
             "{\"video\": \"\", \"caption\": \"x\"}\n"
             "{\"video\": \"a.mp4\"}\n");
  data::SkipLog skips;
  data::DatasetSpec spec;
  spec.path = file;
  const auto media = data::read_captioned_media(spec, skips);
  ASSERT_EQ(media.size(), 2u);
  EXPECT_EQ(media[0].path, dir.file("a.mp4"));
  EXPECT_FALSE(media[0].image);
  EXPECT_EQ(media[0].caption, "a cat");
  EXPECT_EQ(media[1].path, dir.file("b.png"));
  EXPECT_TRUE(media[1].image);
  EXPECT_EQ(media[1].index, 1);
  EXPECT_EQ(skips.counts().bad_sample, 7);
  const std::vector<std::string> reasons = {"\"video\" must be a non-empty path, got number",
                                            "\"caption\" must be a string, got array",
                                            "both \"video\" and \"image\"",
                                            "neither \"video\" nor \"image\"",
                                            "must be an object, got string",
                                            "got an empty string",
                                            "no \"caption\""};
  const auto records = skips.records();
  ASSERT_EQ(records.size(), reasons.size());
  for (size_t i = 0; i < reasons.size(); ++i) {
    EXPECT_EQ(records[i].sample_index, static_cast<int64_t>(i + 2));
    EXPECT_EQ(records[i].file, file);
    EXPECT_NE(records[i].reason.find(reasons[i]), std::string::npos) << records[i].reason;
  }
  write_text(file, "{\"video\": \"a.mp4\", \"caption\": \"a cat\"}\n{\"video\": \n");
  EXPECT_NE(
      message_of([&] { data::read_captioned_media(spec, skips); }).find(file + ": malformed JSON at line 2"),
      std::string::npos);
}

TEST(VideoClips, DecodesVideosAndImagesToTheClipSizeAndSkipsUnusableFilesByKind) {
  TempDir dir;
  // A 48x48 GIF (centre-cropped to 32 with no resizing needed after scaling? no: 48 -> 32 is a
  // resize; a uniform colour stays that colour whatever the filter), a 40x64 PNG, and broken files.
  data::write_gif(uniform_video(9, 48, 200, 40, 10), dir.file("good.gif"));
  data::write_mp4(uniform_video(9, 48, 128, 128, 128), dir.file("good.mp4"));
  data::Image still{40, 64, {}};
  for (int p = 0; p < 40 * 64; ++p) still.rgb.insert(still.rgb.end(), {10, 220, 90});
  data::encode_png_file(still, dir.file("still.png"));
  std::mt19937 random(3);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(random());
  write_text(dir.file("noise.mp4"), noise);
  write_text(dir.file("empty.mp4"), "");
  std::ifstream whole(dir.file("good.mp4"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
  write_text(dir.file("cut.mp4"), bytes.substr(0, bytes.size() / 2));
  data::write_gif(uniform_video(2, 48, 1, 2, 3), dir.file("short.gif"));  // 2 frames: too short for 5
  write_text(dir.file("corrupt.png"), "not a png");
  write_text(dir.file("train.jsonl"),
             "{\"video\": \"good.gif\", \"caption\": \"orange\"}\n"
             "{\"video\": \"good.mp4\", \"caption\": \"grey\"}\n"
             "{\"image\": \"still.png\", \"caption\": \"green\"}\n"
             "{\"video\": \"noise.mp4\", \"caption\": \"x\"}\n"
             "{\"video\": \"empty.mp4\", \"caption\": \"x\"}\n"
             "{\"video\": \"cut.mp4\", \"caption\": \"x\"}\n"
             "{\"video\": \"short.gif\", \"caption\": \"x\"}\n"
             "{\"video\": \"missing.mp4\", \"caption\": \"x\"}\n"
             "{\"image\": \"missing.png\", \"caption\": \"x\"}\n"
             "{\"image\": \"corrupt.png\", \"caption\": \"x\"}\n"
             "{\"video\": 7, \"caption\": \"x\"}\n");
  const VideoClips clips(videos_section(dir.file("train.jsonl")), 11);
  EXPECT_EQ(clips.train_size(), 10);
  EXPECT_EQ(clips.skips().bad_sample, 1);
  EXPECT_EQ(clips.eval_size(), 0);
  EXPECT_EQ(clips.eval_samples(), 0);
  EXPECT_EQ(clips.builtin_tokenizer(), nullptr);
  std::map<std::string, std::vector<uint8_t>> colour = {{"orange", {200, 40, 10}}, {"green", {10, 220, 90}}};
  int usable = 0, images = 0;
  // Two epochs: each file is met twice, in another order.
  for (int64_t i = 0; i < 2 * clips.train_size(); ++i) {
    const auto clip = clips.train(i);
    if (!clip) continue;
    ++usable;
    EXPECT_EQ(clip->height, 32);
    EXPECT_EQ(clip->width, 32);
    EXPECT_EQ(clip->frames, clips.train_frames(i));
    EXPECT_EQ(clip->rgb.size(), static_cast<size_t>(clip->frames) * 32 * 32 * 3);
    if (clip->caption == "green") {
      ++images;
      EXPECT_EQ(clip->frames, 1);
    } else {
      EXPECT_EQ(clip->frames, 5);
    }
    if (auto c = colour.find(clip->caption); c != colour.end()) {
      for (size_t p = 0; p < clip->rgb.size(); p += 3) {
        ASSERT_EQ((std::vector<uint8_t>{clip->rgb[p], clip->rgb[p + 1], clip->rgb[p + 2]}), c->second)
            << clip->caption << " at byte " << p;
      }
    }
  }
  EXPECT_EQ(usable, 6);
  EXPECT_EQ(images, 2);
  const data::SkipCounts counts = clips.skips();
  EXPECT_EQ(counts.missing_video, 2);  // every epoch counts again; the warning names a file once
  EXPECT_EQ(counts.corrupt_video, 8);  // noise, empty, cut, too short
  EXPECT_EQ(counts.missing_image, 2);
  EXPECT_EQ(counts.corrupt_image, 2);
  EXPECT_EQ(counts.bad_sample, 1);
}

TEST(VideoClips, AnUnusableHeldOutSampleIsRefusedByNameBeforeTraining) {
  TempDir dir;
  data::write_gif(uniform_video(9, 32, 9, 9, 9), dir.file("good.gif"));
  write_text(dir.file("noise.mp4"), std::string(2048, '\x17'));
  write_text(dir.file("train.jsonl"), "{\"video\": \"good.gif\", \"caption\": \"a\"}\n");
  write_text(
      dir.file("eval.jsonl"),
      "{\"video\": \"good.gif\", \"caption\": \"a\"}\n{\"video\": \"noise.mp4\", \"caption\": \"b\"}\n");
  config::DataSection d = videos_section(dir.file("train.jsonl"), dir.file("eval.jsonl"));
  const std::string message = message_of([&] { VideoClips(d, 1); });
  EXPECT_NE(message.find("held-out sample 1 of " + dir.file("eval.jsonl") + " cannot be used"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(dir.file("noise.mp4")), std::string::npos) << message;
  d.eval_samples = 1;  // the evaluation takes the first one only: the second is never decoded
  const VideoClips clips(d, 1);
  EXPECT_EQ(clips.eval_size(), 2);
  EXPECT_EQ(clips.eval_samples(), 1);
  EXPECT_EQ(clips.eval(0).frames, 5);
  EXPECT_EQ(clips.eval_caption(1), "b");
  write_text(dir.file("eval.jsonl"), "{\"video\": \"good.gif\", \"caption\": 5}\n");
  EXPECT_NE(message_of([&] { VideoClips(d, 1); }).find("held-out sample 0 of " + dir.file("eval.jsonl")),
            std::string::npos);
  write_text(dir.file("train.jsonl"), "{\"video\": 1, \"caption\": \"a\"}\n");
  EXPECT_NE(message_of([&] { VideoClips(d, 1); }).find("has no usable samples"), std::string::npos);
}

TEST(SameShapeBatches, GroupsByFrameCountInOrderOfFirstAppearance) {
  const std::vector<int64_t> frames = {5, 1, 5, 5, 1, 9, 5, 1};
  const auto batches = same_shape_batches(0, 8, 2, [&](int64_t i) { return frames[static_cast<size_t>(i)]; });
  const std::vector<std::vector<int64_t>> expected = {{0, 2}, {3, 6}, {1, 4}, {7}, {5}};
  EXPECT_EQ(batches, expected);
  EXPECT_EQ(same_shape_batches(3, 6, 8, [&](int64_t i) { return frames[static_cast<size_t>(i)]; }),
            (std::vector<std::vector<int64_t>>{{3}, {4}, {5}}));
  EXPECT_TRUE(same_shape_batches(4, 4, 2, [](int64_t) { return 1; }).empty());
}

}  // namespace
}  // namespace loom::tasks
