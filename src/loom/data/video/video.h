// A video clip in memory: frames of 8-bit RGB at a frame rate, what decode_video produces and the
// GIF and MP4 writers take. One contiguous (frames, height, width, 3) buffer, so a clip becomes a
// uint8 tensor in one copy; a frame becomes an Image when the image tools are wanted.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/image/image.h"

namespace loom::data {

struct Video {
  int frames = 0;
  int height = 0;
  int width = 0;
  double fps = 0;            // playback rate, frames per second
  std::vector<uint8_t> rgb;  // (frames, height, width, 3), row-major

  size_t frame_bytes() const { return static_cast<size_t>(height) * width * 3; }
  uint8_t* frame(int t) { return rgb.data() + static_cast<size_t>(t) * frame_bytes(); }
  const uint8_t* frame(int t) const { return rgb.data() + static_cast<size_t>(t) * frame_bytes(); }
  // A copy of frame t, for the image tools (resize, encode_png_file).
  Image frame_image(int t) const {
    return Image{height, width, std::vector<uint8_t>(frame(t), frame(t) + frame_bytes())};
  }
};

// Why `video` is no clip a writer can take ("" when it is): a side or the frame count below 1, a
// frame rate that is not a positive finite number, or an rgb buffer of another size than
// frames * height * width * 3.
inline std::string video_shape_error(const Video& video) {
  if (video.frames < 1 || video.height < 1 || video.width < 1)
    return "it has " + std::to_string(video.frames) + " frames of " + std::to_string(video.height) + "x" +
           std::to_string(video.width) + " (each must be at least 1)";
  if (!std::isfinite(video.fps) || video.fps <= 0)
    return "its frame rate " + std::to_string(video.fps) + " is not a positive number of frames per second";
  const size_t expected = static_cast<size_t>(video.frames) * video.frame_bytes();
  if (video.rgb.size() != expected)
    return "its rgb buffer has " + std::to_string(video.rgb.size()) +
           " bytes, not frames*height*width*3 = " + std::to_string(expected);
  return "";
}

}  // namespace loom::data
