// Writing a Video as an MP4 file (H.264 through libx264, else MPEG-4 Part 2) through libavformat
// and libavcodec, for clips to watch or to feed back through decode_video.
#pragma once
#include <string>

#include "loom/data/video/video.h"

namespace loom::data {

enum class Mp4Codec {
  kH264OrMpeg4,  // H.264 when libavcodec has libx264, else MPEG-4 Part 2 (its built-in encoder)
  kH264,         // H.264 only: refused when libx264 is absent
  kMpeg4,        // MPEG-4 Part 2 only
};

// Whether this libavcodec can encode H.264 (was built with libx264).
bool h264_encoder_available();

// Writes `video` to `path` as an MP4 at video.fps: yuv420p (BT.601, limited range, tagged so),
// H.264 at constant quality (CRF 18, preset medium) or MPEG-4 Part 2 at quantiser 3; the index
// (moov) comes first, so a browser plays it while loading. yuv420p needs even sides: an odd height
// or width is padded by one row or column repeating the last one, so the file is that much bigger.
// Written to a temporary file beside `path` and renamed into place. Throws DataError naming `path`
// and FFmpeg's error for a malformed video, a missing encoder, or a failed write.
void write_mp4(const Video& video, const std::string& path, Mp4Codec codec = Mp4Codec::kH264OrMpeg4);

}  // namespace loom::data
