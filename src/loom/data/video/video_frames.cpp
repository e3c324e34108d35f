#include "loom/data/video/video_frames.h"

#include <fmt/format.h>

#include "loom/data/image/decode.h"
#include "loom/data/video/video_decode.h"
#include "loom/util/errors.h"

namespace loom::data {

VideoFrames read_video_frames(const VideoSource& video, double fps, int64_t max_frames) {
  if (max_frames < 1) throw ConfigError(fmt::format("a video takes at least 1 frame, not {}", max_frames));
  VideoFrames out;
  if (!video.file.empty()) {
    VideoSampling sampling;
    sampling.frames = static_cast<int>(max_frames);
    sampling.fps = fps;
    sampling.height = sampling.width = 0;
    sampling.whole_video = true;
    const Video decoded = decode_video(video.file, sampling);
    for (int t = 0; t < decoded.frames; ++t) out.frames.push_back(decoded.frame_image(t));
    out.fps = decoded.fps;
    return out;
  }
  const int64_t given = static_cast<int64_t>(video.frames.size());
  if (given == 0) throw DataError("a video without frames");
  const int64_t kept = std::min(given, max_frames);
  for (int64_t i = 0; i < kept; ++i) {
    const int64_t frame = kept == 1 ? 0 : i * (given - 1) / (kept - 1);
    out.frames.push_back(decode_image_file(video.frames[static_cast<size_t>(frame)]));
  }
  out.fps = fps * static_cast<double>(kept) / static_cast<double>(given);
  return out;
}

}  // namespace loom::data
