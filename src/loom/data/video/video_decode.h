// Decoding video files (MP4, WebM/MKV, GIF, AVI, ...) through libavformat and libavcodec into a
// fixed number of RGB frames taken at a fixed rate and cut to a fixed size, as a model consumes them.
#pragma once
#include <string>

#include "loom/data/video/video.h"

namespace loom::data {

// Which frames decode_video takes and at what size.
struct VideoSampling {
  int frames = 16;   // how many frames to take
  double fps = 2;    // at what rate: sample i is the source frame showing i / fps seconds after the first
  int height = 224;  // output size: frames are resized (bilinear) until both sides cover it, then
  int width = 224;   // centre-cropped to it; 0 and 0 keep the size of the first frame
  // A vision-language model's clip: frames taken at fps over the whole video, at most `frames` of
  // them: fewer when the video is shorter (floor(duration x fps), at least 1), and spread over it at
  // frames / duration a second when it is longer. The Video's fps is the rate taken.
  bool whole_video = false;
};

// The containers decode_video opens: FFmpeg demuxer names, a file's demuxer being found from its
// bytes ("mov" covers mp4, m4v and 3gp; "matroska" mkv and webm; the last four are raw streams).
// Demuxers that open further files named inside the data (HLS and concat playlists, image
// sequences) are left out: a data file must not make the loader read elsewhere, or itself again.
constexpr const char* kVideoContainers =
    "mov,mp4,matroska,webm,avi,gif,flv,mpegts,mpeg,ogg,asf,ivf,mxf,nut,apng,h264,hevc,m4v,obu";

// Throws ConfigError unless frames >= 1, fps is positive and finite, and height and width are both
// 0 or both >= 1 with height * width <= kMaxImagePixels.
void check_video_sampling(const VideoSampling& sampling);

// Decodes `sampling.frames` frames of the file's best video stream: sample i is the last source
// frame whose time stamp is at or before start + i / sampling.fps, start being the first frame's
// time stamp (a sampling rate above the source's repeats frames). The source's time stamps decide,
// so variable-rate clips sample correctly. Frames are converted to RGB with the matrix and range
// the stream declares (BT.601 when it declares none); pixels are taken as square, and rotation
// metadata is not applied. Returns a Video with frames, height and width of `sampling` (the first
// frame's size for 0 x 0) and fps = sampling.fps.
//
// Decoding stops once the last sample is known, so only the start of a long file is read. Throws
// DataError naming the file and the reason when the file is missing, not a regular file (a
// directory, /dev/zero), empty, not a container of kVideoContainers, without a video stream,
// declares frames over kMaxImagePixels, has corrupt or truncated data before the last sample (a
// decoder error, a frame decoded with errors, fewer packets than its index lists), or is too short:
// "... has N frames at R fps (D s), too short for F frames at f fps (the last at T s)".
Video decode_video(const std::string& path, const VideoSampling& sampling);

}  // namespace loom::data
