// A conversation's video as the frames a vision-language model's processor takes: a file decoded
// through FFmpeg at a rate, or a list of frame images, either at most a number of frames.
#pragma once
#include <cstdint>
#include <vector>

#include "loom/data/conversation.h"
#include "loom/data/image/image.h"

namespace loom::data {

struct VideoFrames {
  std::vector<Image> frames;
  double fps = 0;  // the rate they were taken at
};

// A file: frames at `fps` over the whole video, at most max_frames of them, spread over it when it is
// longer (decode_video's whole_video). A frame list: every frame at `fps` (the rate the list was
// taken at); a longer list is thinned to max_frames evenly (frames i * (n - 1) / (max_frames - 1),
// truncated), its rate scaled alike. DataError naming the file and reason when a file or a frame is
// missing, empty, corrupt or does not decode.
VideoFrames read_video_frames(const VideoSource& video, double fps, int64_t max_frames);

}  // namespace loom::data
