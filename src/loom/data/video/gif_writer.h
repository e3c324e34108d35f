// Writing a Video as a looping animated GIF through giflib, for looking at clips (samples, model
// outputs) in a browser or an image viewer.
#pragma once
#include <string>

#include "loom/data/video/video.h"

namespace loom::data {

// The fastest rate a GIF plays as written: frame delays are whole centiseconds, and browsers play
// delays under 2 cs as 10 cs.
constexpr double kMaxGifFps = 50;

// Writes `video` to `path` as a GIF89a that loops forever. Frame i is shown from floor(100 i / fps)
// centiseconds on, so the delays (whole centiseconds) average exactly 1/fps however fps divides 100.
// Each frame has its own 256-colour palette: exact when the frame has at most 256 colours (grey
// clips, flat synthetic ones), else giflib's median-cut GifQuantizeBuffer (5 bits a channel, no
// dithering). Written to a temporary file beside `path` and renamed into place. Throws DataError
// naming `path` for a malformed video, a side over 65535 (GIF's limit), fps above kMaxGifFps or so
// low a frame's delay passes 65535 cs, or a failed write.
void write_gif(const Video& video, const std::string& path);

}  // namespace loom::data
