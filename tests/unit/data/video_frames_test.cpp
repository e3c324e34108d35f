// A conversation's video as a vision-language model takes it (read_video_frames): a file sampled at a
// rate over its whole length, at most a number of frames, spread evenly over a longer video; a frame
// list thinned evenly, its rate scaled alike. The clips are grey GIFs whose frame t is level 20 t
// (a GIF of at most 256 colours is exact), so each frame taken is known by its level.
#include "loom/data/video/video_frames.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../checkpoint/temp_dir.h"
#include "loom/data/image/decode.h"
#include "loom/data/image/image.h"
#include "loom/data/video/gif_writer.h"
#include "loom/util/errors.h"

namespace loom::data {
namespace {

// A 10-frame 16x16 grey clip at 5 fps (2 s), frame t at level 20 t.
Video levels_clip() {
  Video clip{10, 16, 16, 5.0, std::vector<uint8_t>(10 * 16 * 16 * 3)};
  for (int t = 0; t < clip.frames; ++t)
    std::fill(clip.frame(t), clip.frame(t) + clip.frame_bytes(), static_cast<uint8_t>(20 * t));
  return clip;
}

std::vector<int> source_frames(const VideoFrames& taken) {
  std::vector<int> out;
  for (const Image& frame : taken.frames) out.push_back(frame.rgb.at(0) / 20);
  return out;
}

class VideoFramesTest : public ::testing::Test {
 protected:
  void SetUp() override { write_gif(levels_clip(), path_); }
  checkpoint::testing::TempDir scratch_;
  std::string path_ = (scratch_.path() / "levels.gif").string();
};

TEST_F(VideoFramesTest, AFileIsSampledAtTheRateOverItsWholeLength) {
  // 2 fps over 2 s: 4 frames, at 0, 0.5, 1 and 1.5 s.
  VideoFrames taken = read_video_frames({path_, {}}, 2.0, 128);
  EXPECT_EQ(source_frames(taken), (std::vector<int>{0, 2, 5, 7}));
  EXPECT_DOUBLE_EQ(taken.fps, 2.0);
  // A rate the video is too short for gives one frame.
  taken = read_video_frames({path_, {}}, 0.25, 128);
  EXPECT_EQ(source_frames(taken), (std::vector<int>{0}));
}

TEST_F(VideoFramesTest, MoreFramesThanTheMostAreSpreadOverTheWholeVideo) {
  // 5 fps would give 10 frames; at most 4 are taken at 4 / 2 s = 2 fps, spanning the video.
  const VideoFrames taken = read_video_frames({path_, {}}, 5.0, 4);
  EXPECT_EQ(source_frames(taken), (std::vector<int>{0, 2, 5, 7}));
  EXPECT_DOUBLE_EQ(taken.fps, 2.0);
}

TEST_F(VideoFramesTest, AFrameListIsThinnedEvenlyAndItsRateScaled) {
  std::vector<std::string> frames;
  const Video clip = levels_clip();
  for (int t = 0; t < 7; ++t) {
    frames.push_back((scratch_.path() / ("f" + std::to_string(t) + ".png")).string());
    encode_png_file(clip.frame_image(t), frames.back());
  }
  VideoFrames taken = read_video_frames({"", frames}, 2.0, 3);
  EXPECT_EQ(source_frames(taken), (std::vector<int>{0, 3, 6}));
  EXPECT_DOUBLE_EQ(taken.fps, 2.0 * 3 / 7);
  taken = read_video_frames({"", frames}, 2.0, 128);  // all of them, at the rate given
  EXPECT_EQ(taken.frames.size(), 7u);
  EXPECT_DOUBLE_EQ(taken.fps, 2.0);
}

TEST_F(VideoFramesTest, AnEmptyOrCorruptFileIsAnErrorNamingIt) {
  const std::string empty = (scratch_.path() / "empty.mp4").string();
  checkpoint::testing::write_bytes(empty, "");
  try {
    read_video_frames({empty, {}}, 2.0, 8);
    FAIL() << "an empty file should not decode";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(empty + ": it is empty (0 bytes)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::data
