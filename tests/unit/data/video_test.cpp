// Checks the GIF and MP4 writers by reading their files back (giflib's DGifSlurp, decode_video),
// decode_video's sampling in time, resizing and cropping, and that bad files fail with a DataError
// naming the file.
#include "loom/data/video/video.h"

#include <gif_lib.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "data_test_util.h"
#include "loom/data/image/decode.h"
#include "loom/data/video/gif_writer.h"
#include "loom/data/video/mp4_writer.h"
#include "loom/data/video/video_decode.h"
#include "loom/util/errors.h"
#include "loom/util/filesystem.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;
using loom::test::message_of;
using loom::test::says_all;

// A scratch path for the running test (tests may run side by side as separate processes).
std::string scratch(const std::string& suffix) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "loom_video_" + test->test_suite_name() + "_" + test->name() + suffix;
}

// Removes a file or directory at scope exit (remove_tree: see loom/util/filesystem.h).
struct Scratch {
  std::string path;
  explicit Scratch(const std::string& suffix) : path(scratch(suffix)) {}
  ~Scratch() {
    std::error_code ignored;
    remove_tree(path, ignored);
  }
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A red 12x12 square moving right 3 and down 2 pixels a frame over a blue-grey background.
Video moving_square(int frames = 9, int height = 48, int width = 48, double fps = 8) {
  Video video{frames, height, width, fps, {}};
  video.rgb.resize(static_cast<size_t>(frames) * video.frame_bytes());
  for (int t = 0; t < frames; ++t)
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x) {
        const bool inside = x >= 4 + 3 * t && x < 16 + 3 * t && y >= 6 + 2 * t && y < 18 + 2 * t;
        uint8_t* p = video.frame(t) + (static_cast<size_t>(y) * width + x) * 3;
        p[0] = inside ? 230 : 40;
        p[1] = inside ? 60 : 90;
        p[2] = inside ? 30 : 160;
      }
  return video;
}

// Mean absolute difference of two equally long byte ranges.
double mean_abs_difference(const uint8_t* a, const uint8_t* b, size_t count) {
  double sum = 0;
  for (size_t i = 0; i < count; ++i) sum += std::abs(int{a[i]} - int{b[i]});
  return sum / static_cast<double>(count);
}

// Names of the files beside `path` whose names start with its own: a writer's leftovers.
std::vector<std::string> files_beside(const std::string& path) {
  std::vector<std::string> names;
  const fs::path target(path);
  for (const auto& entry : fs::directory_iterator(target.parent_path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(target.filename().string(), 0) == 0) names.push_back(name);
  }
  return names;
}

// Owns a GIF opened for reading with the whole file read (DGifSlurp).
struct SlurpedGif {
  GifFileType* gif = nullptr;
  explicit SlurpedGif(const std::string& path) {
    int error = 0;
    gif = DGifOpenFileName(path.c_str(), &error);
    EXPECT_NE(gif, nullptr) << GifErrorString(error);
    if (gif) {
      EXPECT_EQ(DGifSlurp(gif), GIF_OK) << GifErrorString(gif->Error);
    }
  }
  ~SlurpedGif() {
    if (gif) DGifCloseFile(gif, nullptr);
  }
  // Image i as (height, width, 3) RGB through its colour map (its own, else the global one).
  std::vector<uint8_t> rgb(int i) const {
    const SavedImage& image = gif->SavedImages[i];
    const ColorMapObject* map = image.ImageDesc.ColorMap ? image.ImageDesc.ColorMap : gif->SColorMap;
    const size_t pixels = static_cast<size_t>(image.ImageDesc.Width) * image.ImageDesc.Height;
    std::vector<uint8_t> out(pixels * 3);
    for (size_t p = 0; p < pixels; ++p) {
      const GifColorType colour = map->Colors[image.RasterBits[p]];
      out[3 * p] = colour.Red;
      out[3 * p + 1] = colour.Green;
      out[3 * p + 2] = colour.Blue;
    }
    return out;
  }
};

TEST(GifWriter, WritesALoopingGif89aWithExactColoursAndDelaysFromFps) {
  const Video video = moving_square();
  const Scratch gif_file(".gif");
  write_gif(video, gif_file.path);
  EXPECT_EQ(files_beside(gif_file.path),
            std::vector<std::string>{fs::path(gif_file.path).filename().string()});

  const std::vector<uint8_t> bytes = read_bytes(gif_file.path);
  ASSERT_GE(bytes.size(), 6u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 6), "GIF89a");

  SlurpedGif gif(gif_file.path);
  ASSERT_NE(gif.gif, nullptr);
  EXPECT_EQ(gif.gif->SWidth, 48);
  EXPECT_EQ(gif.gif->SHeight, 48);
  ASSERT_EQ(gif.gif->ImageCount, 9);
  int total_delay = 0;
  for (int t = 0; t < 9; ++t) {
    SCOPED_TRACE(t);
    const GifImageDesc& desc = gif.gif->SavedImages[t].ImageDesc;
    EXPECT_EQ(desc.Left, 0);
    EXPECT_EQ(desc.Top, 0);
    EXPECT_EQ(desc.Width, 48);
    EXPECT_EQ(desc.Height, 48);
    // Two colours a frame: the palette is the frame's own, so nothing is lost.
    const std::vector<uint8_t> rgb = gif.rgb(t);
    EXPECT_EQ(rgb, std::vector<uint8_t>(video.frame(t), video.frame(t) + video.frame_bytes()));
    GraphicsControlBlock control;
    ASSERT_EQ(DGifSavedExtensionToGCB(gif.gif, t, &control), GIF_OK);
    EXPECT_EQ(control.DelayTime, t % 2 == 0 ? 12 : 13);  // 12.5 cs a frame at 8 fps
    EXPECT_EQ(control.TransparentColor, NO_TRANSPARENT_COLOR);
    total_delay += control.DelayTime;
  }
  EXPECT_EQ(total_delay, 112);  // floor(9 frames * 12.5 cs)

  // NETSCAPE2.0 with loop count 0 before the first frame: loop forever.
  const SavedImage& first = gif.gif->SavedImages[0];
  bool loops = false;
  for (int b = 0; b + 1 < first.ExtensionBlockCount; ++b) {
    const ExtensionBlock& block = first.ExtensionBlocks[b];
    const ExtensionBlock& next = first.ExtensionBlocks[b + 1];
    if (block.Function == APPLICATION_EXT_FUNC_CODE && block.ByteCount == 11 &&
        std::string(reinterpret_cast<const char*>(block.Bytes), 11) == "NETSCAPE2.0" && next.ByteCount == 3 &&
        next.Bytes[0] == 1 && next.Bytes[1] == 0 && next.Bytes[2] == 0)
      loops = true;
  }
  EXPECT_TRUE(loops);
}

// A grey ramp has 256 colours: it keeps every grey exactly.
TEST(GifWriter, GreyClipsKeepExactGreys) {
  Video video{2, 4, 64, 10, {}};
  video.rgb.resize(2 * video.frame_bytes());
  for (size_t i = 0; i < video.rgb.size() / 3; ++i)
    for (int c = 0; c < 3; ++c) video.rgb[3 * i + c] = static_cast<uint8_t>(i % 256);
  const Scratch gif_file(".gif");
  write_gif(video, gif_file.path);
  SlurpedGif gif(gif_file.path);
  ASSERT_NE(gif.gif, nullptr);
  ASSERT_EQ(gif.gif->ImageCount, 2);
  for (int t = 0; t < 2; ++t)
    EXPECT_EQ(gif.rgb(t), std::vector<uint8_t>(video.frame(t), video.frame(t) + video.frame_bytes()));
}

// 4096 colours go through median cut: close, not exact.
TEST(GifWriter, FramesWithManyColoursAreQuantisedClosely) {
  Video video{1, 64, 64, 10, {}};
  video.rgb.resize(video.frame_bytes());
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 64; ++x) {
      uint8_t* p = video.frame(0) + (static_cast<size_t>(y) * 64 + x) * 3;
      p[0] = static_cast<uint8_t>(4 * x);
      p[1] = static_cast<uint8_t>(4 * y);
      p[2] = static_cast<uint8_t>(255 - 2 * (x + y));
    }
  const Scratch gif_file(".gif");
  write_gif(video, gif_file.path);
  SlurpedGif gif(gif_file.path);
  ASSERT_NE(gif.gif, nullptr);
  ASSERT_EQ(gif.gif->ImageCount, 1);
  const std::vector<uint8_t> rgb = gif.rgb(0);
  const double error = mean_abs_difference(rgb.data(), video.frame(0), video.frame_bytes());
  EXPECT_LT(error, 10.0);  // 7.3 with giflib 5.2.1
  EXPECT_GT(error, 0.0);
}

TEST(GifWriter, RefusesWhatAGifCannotShowNamingTheFile) {
  const Scratch gif_file(".gif");
  Video fast = moving_square(3, 8, 8, 60);
  EXPECT_TRUE(says_all(message_of([&] { write_gif(fast, gif_file.path); }), {gif_file.path, "60 fps", "50"}));
  Video broken = moving_square(3, 8, 8, 8);
  broken.rgb.pop_back();
  EXPECT_TRUE(says_all(message_of([&] { write_gif(broken, gif_file.path); }), {gif_file.path, "rgb buffer"}));
  EXPECT_FALSE(fs::exists(gif_file.path));
  const std::string nowhere = scratch("_missing_dir/out.gif");
  EXPECT_TRUE(says_all(message_of([&] { write_gif(moving_square(), nowhere); }), {nowhere}));
}

TEST(Mp4Writer, H264RoundTripsThroughDecodeWithinLossyTolerance) {
  if (!h264_encoder_available()) GTEST_SKIP() << "this libavcodec has no libx264";
  const Video video = moving_square();
  const Scratch mp4(".mp4");
  write_mp4(video, mp4.path, Mp4Codec::kH264);
  EXPECT_EQ(files_beside(mp4.path), std::vector<std::string>{fs::path(mp4.path).filename().string()});
  // An ISO media file with its index (moov) before the frames (mdat): playable while loading.
  const std::vector<uint8_t> bytes = read_bytes(mp4.path);
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_EQ(text.substr(4, 4), "ftyp");
  ASSERT_NE(text.find("moov"), std::string::npos);
  EXPECT_LT(text.find("moov"), text.find("mdat"));
  EXPECT_NE(text.find("avc1"), std::string::npos);

  const Video back = decode_video(mp4.path, VideoSampling{9, 8, 48, 48});
  ASSERT_EQ(back.frames, 9);
  ASSERT_EQ(back.height, 48);
  ASSERT_EQ(back.width, 48);
  EXPECT_EQ(back.fps, 8);
  ASSERT_EQ(back.rgb.size(), video.rgb.size());
  for (int t = 0; t < 9; ++t)
    EXPECT_LT(mean_abs_difference(back.frame(t), video.frame(t), video.frame_bytes()), 8.0) << "frame " << t;
}

TEST(Mp4Writer, Mpeg4RoundTripsThroughDecodeWithinLossyTolerance) {
  const Video video = moving_square();
  const Scratch mp4(".mp4");
  write_mp4(video, mp4.path, Mp4Codec::kMpeg4);
  EXPECT_NE(read_bytes(mp4.path).size(), 0u);
  const Video back = decode_video(mp4.path, VideoSampling{9, 8, 48, 48});
  ASSERT_EQ(back.frames, 9);
  for (int t = 0; t < 9; ++t)
    EXPECT_LT(mean_abs_difference(back.frame(t), video.frame(t), video.frame_bytes()), 8.0) << "frame " << t;
}

// yuv420p needs even sides: 45x47 is stored as 46x48, the extra row and column repeating the last.
TEST(Mp4Writer, OddSidesArePaddedByRepeatingTheEdge) {
  const Video video = moving_square(9, 45, 47, 8);
  const Scratch mp4(".mp4");
  write_mp4(video, mp4.path);
  const Video back = decode_video(mp4.path, VideoSampling{9, 8, 0, 0});
  ASSERT_EQ(back.height, 46);
  ASSERT_EQ(back.width, 48);
  for (int t = 0; t < 9; ++t) {
    SCOPED_TRACE(t);
    double sum = 0;
    for (int y = 0; y < 46; ++y)
      for (int x = 0; x < 48; ++x) {
        const uint8_t* got = back.frame(t) + (static_cast<size_t>(y) * 48 + x) * 3;
        const uint8_t* want =
            video.frame(t) + (static_cast<size_t>(std::min(y, 44)) * 47 + std::min(x, 46)) * 3;
        sum += mean_abs_difference(got, want, 3);
      }
    EXPECT_LT(sum / (46 * 48), 8.0);
  }
}

TEST(Mp4Writer, RefusesMalformedVideosNamingTheFile) {
  const Scratch mp4(".mp4");
  Video no_rate = moving_square(2, 8, 8, 0);
  EXPECT_TRUE(says_all(message_of([&] { write_mp4(no_rate, mp4.path); }), {mp4.path, "frame rate"}));
  const std::string nowhere = scratch("_missing_dir/out.mp4");
  EXPECT_TRUE(says_all(message_of([&] { write_mp4(moving_square(), nowhere); }), {nowhere}));
  EXPECT_FALSE(fs::exists(mp4.path));
}

// Which source frame of moving_square() a decoded frame is: the one it is closest to.
int closest_source_frame(const Video& source, const Video& decoded, int t) {
  int best = -1;
  double best_error = 1e9;
  for (int s = 0; s < source.frames; ++s) {
    const double error = mean_abs_difference(decoded.frame(t), source.frame(s), source.frame_bytes());
    if (error < best_error) {
      best = s;
      best_error = error;
    }
  }
  return best;
}

TEST(DecodeVideo, SamplesByTimeStampsAtTheRequestedRate) {
  const Video video = moving_square();  // 9 frames at 8 fps: 1.125 s
  const Scratch mp4(".mp4");
  write_mp4(video, mp4.path);
  // Half the rate takes every other frame.
  const Video half = decode_video(mp4.path, VideoSampling{5, 4, 48, 48});
  ASSERT_EQ(half.frames, 5);
  EXPECT_EQ(half.fps, 4);
  for (int t = 0; t < 5; ++t) EXPECT_EQ(closest_source_frame(video, half, t), 2 * t) << t;
  // Twice the rate shows each frame twice.
  const Video twice = decode_video(mp4.path, VideoSampling{18, 16, 48, 48});
  for (int t = 0; t < 18; ++t) EXPECT_EQ(closest_source_frame(video, twice, t), t / 2) << t;
  // Fewer frames than the clip has stop early; the first frames are the clip's first.
  const Video three = decode_video(mp4.path, VideoSampling{3, 8, 48, 48});
  for (int t = 0; t < 3; ++t) EXPECT_EQ(closest_source_frame(video, three, t), t) << t;
}

TEST(DecodeVideo, AClipTooShortForTheSampleIsADataError) {
  const Scratch mp4(".mp4");
  write_mp4(moving_square(), mp4.path);
  // The 10th frame at 8 fps would show at 1.125 s, when the clip has ended.
  EXPECT_TRUE(says_all(message_of([&] {
                         decode_video(mp4.path, VideoSampling{10, 8, 48, 48});
                       }),
                       {mp4.path, "has 9 frames at 8 fps (1.125 s)", "too short for 10 frames at 8 fps",
                        "the last at 1.125 s"}));
  EXPECT_TRUE(says_all(message_of([&] {
                         decode_video(mp4.path, VideoSampling{6, 4, 48, 48});
                       }),
                       {mp4.path, "has 9 frames", "too short for 6 frames at 4 fps"}));
}

// A GIF's palette decodes exactly, and its centisecond delays (12, 13, 12, ...) still place every
// frame at or before its sample time at 8 fps.
TEST(DecodeVideo, GifsDecodeLosslesslyAtTheirRate) {
  const Video video = moving_square();
  const Scratch gif_file(".gif");
  write_gif(video, gif_file.path);
  const Video back = decode_video(gif_file.path, VideoSampling{9, 8, 0, 0});
  ASSERT_EQ(back.height, 48);
  ASSERT_EQ(back.width, 48);
  EXPECT_EQ(back.rgb, video.rgb);
}

// A 48x64 clip at 24x24: resized to 24x32 (both sides cover 24), then 4 columns cut from each side.
TEST(DecodeVideo, ResizesUntilBothSidesCoverThenCentreCrops) {
  // Eight vertical bands of 8 columns, each its own colour.
  Video video{2, 48, 64, 4, {}};
  video.rgb.resize(2 * video.frame_bytes());
  auto band_colour = [](int band) {
    return std::vector<uint8_t>{static_cast<uint8_t>(30 * band), static_cast<uint8_t>(200 - 20 * band),
                                static_cast<uint8_t>(band % 2 ? 220 : 40)};
  };
  for (int t = 0; t < 2; ++t)
    for (int y = 0; y < 48; ++y)
      for (int x = 0; x < 64; ++x) {
        const std::vector<uint8_t> colour = band_colour(x / 8);
        std::copy(colour.begin(), colour.end(), video.frame(t) + (static_cast<size_t>(y) * 64 + x) * 3);
      }
  const Scratch gif_file(".gif");  // lossless, so only the resize is measured
  write_gif(video, gif_file.path);
  const Video back = decode_video(gif_file.path, VideoSampling{2, 4, 24, 24});
  ASSERT_EQ(back.height, 24);
  ASSERT_EQ(back.width, 24);
  // Output column c is scaled column c + 4, source columns 2c + 8 and 2c + 9: band (c + 4) / 4. The
  // middle two of each band's four columns are away from the blend with its neighbours.
  for (int c = 1; c < 24; c += 4)
    for (int y = 0; y < 24; y += 5) {
      SCOPED_TRACE(testing::Message() << "column " << c << " row " << y);
      const std::vector<uint8_t> want = band_colour((c + 4) / 4);
      const uint8_t* got = back.frame(1) + (static_cast<size_t>(y) * 24 + c) * 3;
      for (int k = 0; k < 3; ++k) EXPECT_NEAR(got[k], want[k], 3) << "channel " << k;
    }
}

TEST(DecodeVideo, BadFilesAreDataErrorsNamingTheFile) {
  const Scratch dir("_dir");
  fs::create_directory(dir.path);
  const std::string noise = dir.path + "/noise.mp4", cut = dir.path + "/cut.mp4",
                    empty = dir.path + "/empty.mp4", text = dir.path + "/notes.mp4",
                    whole = dir.path + "/whole.mp4", missing = dir.path + "/none.mp4";
  std::mt19937 random(7);
  std::vector<uint8_t> noise_bytes(8192);
  for (uint8_t& b : noise_bytes) b = static_cast<uint8_t>(random());
  write_bytes(noise, noise_bytes);
  const std::string noise_bin = dir.path + "/noise.bin";  // no extension to guess from
  write_bytes(noise_bin, noise_bytes);
  const std::string png = dir.path + "/still.png";  // FFmpeg reads it, as an image, not a video
  encode_png_file(Image::filled(8, 8, 1, 2, 3), png);
  write_mp4(moving_square(), whole);
  const std::vector<uint8_t> whole_bytes = read_bytes(whole);
  write_bytes(cut, std::vector<uint8_t>(whole_bytes.begin(), whole_bytes.begin() + whole_bytes.size() / 2));
  write_bytes(empty, {});
  std::ofstream(text) << "not a video, only some words\n";

  const VideoSampling all{9, 8, 48, 48};
  EXPECT_NO_THROW(decode_video(whole, all));
  for (const auto& [path, reason] :
       std::vector<std::pair<std::string, std::string>>{{noise, ""},
                                                        {noise_bin, ""},
                                                        {png, "'png_pipe' file"},
                                                        {cut, ""},
                                                        {empty, "empty"},
                                                        {text, ""},
                                                        {dir.path, "is a directory"},
                                                        {"/dev/zero", "special file"},
                                                        {missing, "does not exist"}}) {
    SCOPED_TRACE(path);
    const std::string message = message_of([&] { decode_video(path, all); });
    EXPECT_TRUE(says_all(message, {"cannot decode video " + path + ": ", reason}));
  }
  // Every cut of the file fails cleanly: in the header, the index or the frames.
  for (size_t keep : {size_t{8}, size_t{100}, whole_bytes.size() / 4, whole_bytes.size() - 100}) {
    SCOPED_TRACE(keep);
    write_bytes(cut, std::vector<uint8_t>(whole_bytes.begin(), whole_bytes.begin() + keep));
    EXPECT_TRUE(says_all(message_of([&] { decode_video(cut, all); }), {cut}));
  }
}

// Damaged copies of a good MP4 and GIF (bits flipped, bytes overwritten, the tail cut) either decode
// or fail with a DataError naming the file: never a crash, a hang or another exception.
TEST(DecodeVideo, DamagedFilesDecodeOrThrowDataError) {
  const Scratch dir("_dir");
  fs::create_directory(dir.path);
  const std::string mp4 = dir.path + "/good.mp4", gif = dir.path + "/good.gif",
                    damaged = dir.path + "/damaged";
  write_mp4(moving_square(), mp4);
  write_gif(moving_square(), gif);
  std::mt19937 random(11);
  int failures = 0;
  for (const std::string& good : {mp4, gif}) {
    const std::vector<uint8_t> bytes = read_bytes(good);
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<uint8_t> copy = bytes;
      const size_t at = random() % copy.size();
      switch (trial % 3) {
        case 0:
          copy[at] ^= static_cast<uint8_t>(1u << (random() % 8));
          break;
        case 1:
          for (size_t k = at; k < std::min(copy.size(), at + 16); ++k)
            copy[k] = static_cast<uint8_t>(random());
          break;
        default:
          copy.resize(at);
      }
      write_bytes(damaged, copy);
      try {
        decode_video(damaged, VideoSampling{9, 8, 32, 40});
      } catch (const DataError& e) {
        ++failures;
        EXPECT_TRUE(says_all(e.what(), {damaged})) << "trial " << trial;
      }
    }
  }
  EXPECT_GT(failures, 0);
}

// A GIF whose screen is 20000x20000 (400 M pixels) around one 1x1 image: ten bytes of header that
// would make a decoder allocate 1.6 GB.
TEST(DecodeVideo, SizesAboveThePixelBudgetAreRefusedBeforeDecoding) {
  const Scratch bomb(".gif");
  int error = 0;
  GifFileType* gif = EGifOpenFileName(bomb.path.c_str(), false, &error);
  ASSERT_NE(gif, nullptr);
  EGifSetGifVersion(gif, true);
  GifColorType colours[2] = {{0, 0, 0}, {255, 255, 255}};
  ColorMapObject* map = GifMakeMapObject(2, colours);
  EXPECT_EQ(EGifPutScreenDesc(gif, 20000, 20000, 1, 0, map), GIF_OK);
  EXPECT_EQ(EGifPutImageDesc(gif, 0, 0, 1, 1, false, nullptr), GIF_OK);
  GifPixelType pixel = 1;
  EXPECT_EQ(EGifPutLine(gif, &pixel, 1), GIF_OK);
  EXPECT_EQ(EGifCloseFile(gif, &error), GIF_OK);
  GifFreeMapObject(map);
  EXPECT_TRUE(says_all(message_of([&] {
                         decode_video(bomb.path, VideoSampling{1, 1, 8, 8});
                       }),
                       {bomb.path, "20000x20000", "more than the 89478485"}));
}

// An MP4 whose sample entry (avc1) is patched to declare 20000x20000 frames.
TEST(DecodeVideo, AnMp4DeclaringTooManyPixelsIsRefused) {
  const Scratch mp4(".mp4");
  write_mp4(moving_square(), mp4.path);
  std::vector<uint8_t> bytes = read_bytes(mp4.path);
  const std::string text(bytes.begin(), bytes.end());
  // The first after the sample description box: "avc1" also names a brand in the ftyp box.
  const size_t entry = text.find(h264_encoder_available() ? "avc1" : "mp4v", text.find("stsd"));
  ASSERT_NE(entry, std::string::npos);
  // After the type: 6 reserved bytes, a data reference index, 16 bytes of version, revision,
  // vendor and qualities, then width and height (16 bits each, big-endian). 20000 = 0x4E20.
  const size_t width_at = entry + 4 + 6 + 2 + 16;
  ASSERT_EQ(bytes[width_at] * 256 + bytes[width_at + 1], 48);
  for (size_t at : {width_at, width_at + 2}) {
    bytes[at] = 0x4E;
    bytes[at + 1] = 0x20;
  }
  write_bytes(mp4.path, bytes);
  EXPECT_TRUE(says_all(message_of([&] {
                         decode_video(mp4.path, VideoSampling{9, 8, 48, 48});
                       }),
                       {mp4.path, "20000x20000", "more than the 89478485"}));
}

TEST(DecodeVideo, SamplingIsCheckedAsConfiguration) {
  EXPECT_NO_THROW(check_video_sampling(VideoSampling{}));
  EXPECT_NO_THROW(check_video_sampling(VideoSampling{1, 0.5, 0, 0}));
  for (const VideoSampling& bad :
       {VideoSampling{0, 2, 8, 8}, VideoSampling{4, 0, 8, 8}, VideoSampling{4, std::nan(""), 8, 8},
        VideoSampling{4, 2, 0, 8}, VideoSampling{4, 2, 20000, 20000}})
    EXPECT_THROW(decode_video("/does/not/matter.mp4", bad), ConfigError);
}

}  // namespace
}  // namespace loom::data
