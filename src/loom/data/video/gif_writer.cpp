// Streams frames through giflib's sequential encoder (one frame's indices in memory at a time).
#include "loom/data/video/gif_writer.h"

#include <fmt/format.h>
#include <gif_lib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/data/video/staged_file.h"
#include "loom/util/errors.h"

namespace loom::data {
namespace {

constexpr int kMaxGifSide = 65535;  // the logical screen's sides are 16-bit

// One frame as palette indices: (height, width) indices into `colours`.
struct PalettedFrame {
  std::vector<GifColorType> colours;  // at most 256
  std::vector<GifPixelType> indices;
};

// The frame's own colours when it has at most 256, else an empty result.
PalettedFrame exact_palette(const uint8_t* rgb, size_t pixels) {
  PalettedFrame out;
  out.indices.resize(pixels);
  std::unordered_map<uint32_t, GifPixelType> index_of;
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* p = rgb + 3 * i;
    const uint32_t key = (uint32_t{p[0]} << 16) | (uint32_t{p[1]} << 8) | p[2];
    auto found = index_of.find(key);
    if (found == index_of.end()) {
      if (out.colours.size() == 256) return {};
      found = index_of.emplace(key, static_cast<GifPixelType>(out.colours.size())).first;
      out.colours.push_back(GifColorType{p[0], p[1], p[2]});
    }
    out.indices[i] = found->second;
  }
  return out;
}

// Median cut over the frame's colours (giflib's GifQuantizeBuffer); false when giflib fails.
bool quantised_palette(const uint8_t* rgb, int height, int width, PalettedFrame* out) {
  const size_t pixels = static_cast<size_t>(height) * width;
  std::vector<GifByteType> red(pixels), green(pixels), blue(pixels);  // giflib wants planes
  for (size_t i = 0; i < pixels; ++i) {
    red[i] = rgb[3 * i];
    green[i] = rgb[3 * i + 1];
    blue[i] = rgb[3 * i + 2];
  }
  int colour_count = 256;
  out->colours.assign(256, GifColorType{0, 0, 0});
  out->indices.resize(pixels);
  if (GifQuantizeBuffer(static_cast<unsigned>(width), static_cast<unsigned>(height), &colour_count,
                        red.data(), green.data(), blue.data(), out->indices.data(),
                        out->colours.data()) != GIF_OK)
    return false;
  out->colours.resize(static_cast<size_t>(std::clamp(colour_count, 1, 256)));
  return true;
}

// giflib's message for an error code (GifErrorString gives none for codes it does not know).
std::string gif_error_text(int code) {
  const char* text = GifErrorString(code);
  return text ? text : "giflib error " + std::to_string(code);
}

// Owns a giflib encoder; closing flushes, so the successful path closes explicitly to check it.
struct GifEncoder {
  GifFileType* gif = nullptr;
  ~GifEncoder() {
    if (gif) EGifCloseFile(gif, nullptr);
  }
  // giflib's message for the last error of this encoder.
  std::string error() const { return gif_error_text(gif ? gif->Error : E_GIF_ERR_WRITE_FAILED); }
};

// Owns a giflib colour map.
struct GifColourMap {
  ColorMapObject* map = nullptr;
  ~GifColourMap() { GifFreeMapObject(map); }
};

// The delay before frame t+1 replaces frame t, in centiseconds: frame t is shown from
// floor(100 t / fps), so rounding never accumulates (8 fps: 12, 13, 12, 13, ...).
int delay_centiseconds(int t, double fps) {
  // The small margin keeps a whole number such as 100*3/10 from flooring to 29.
  auto start = [fps](int frame) { return static_cast<int64_t>(std::floor(100.0 * frame / fps + 1e-9)); };
  return static_cast<int>(start(t + 1) - start(t));
}

}  // namespace

void write_gif(const Video& video, const std::string& path) {
  if (const std::string why = video_shape_error(video); !why.empty())
    throw DataError(fmt::format("cannot write GIF {}: {}", path, why));
  if (video.height > kMaxGifSide || video.width > kMaxGifSide)
    throw DataError(fmt::format("cannot write GIF {}: its frames are {}x{}, and a GIF's sides are at most {}",
                                path, video.height, video.width, kMaxGifSide));
  if (video.fps > kMaxGifFps)
    throw DataError(fmt::format(
        "cannot write GIF {}: {} fps is faster than the {} a GIF plays (delays are whole centiseconds, "
        "and browsers slow delays under 2 cs to 10 cs); write an MP4 or subsample the frames",
        path, video.fps, kMaxGifFps));

  StagedFile file(path, "GIF");
  auto fail = [&](const std::string& step, const std::string& reason) {
    return DataError(fmt::format("cannot write GIF {}: {}: {}", path, step, reason));
  };
  GifEncoder encoder;
  int open_error = 0;
  encoder.gif = EGifOpenFileName(file.temporary_path().c_str(), false, &open_error);
  if (!encoder.gif) throw fail("cannot open " + file.temporary_path(), gif_error_text(open_error));
  // The sequential API would stamp GIF87a, which has no frame delays or looping.
  EGifSetGifVersion(encoder.gif, true);
  // No global colour map: every frame brings its own.
  if (EGifPutScreenDesc(encoder.gif, video.width, video.height, 8, 0, nullptr) != GIF_OK)
    throw fail("screen descriptor", encoder.error());
  // NETSCAPE2.0 application extension, sub-block 1 with a loop count of 0: loop forever.
  const GifByteType loop[3] = {1, 0, 0};
  if (EGifPutExtensionLeader(encoder.gif, APPLICATION_EXT_FUNC_CODE) != GIF_OK ||
      EGifPutExtensionBlock(encoder.gif, 11, "NETSCAPE2.0") != GIF_OK ||
      EGifPutExtensionBlock(encoder.gif, 3, loop) != GIF_OK || EGifPutExtensionTrailer(encoder.gif) != GIF_OK)
    throw fail("looping extension", encoder.error());

  const size_t pixels = static_cast<size_t>(video.height) * video.width;
  for (int t = 0; t < video.frames; ++t) {
    PalettedFrame frame = exact_palette(video.frame(t), pixels);
    if (frame.colours.empty() && !quantised_palette(video.frame(t), video.height, video.width, &frame))
      throw fail(fmt::format("frame {}", t), "giflib could not quantise its colours");

    GraphicsControlBlock control{};
    control.DisposalMode = DISPOSE_DO_NOT;  // every frame covers the whole screen
    control.UserInputFlag = false;
    control.DelayTime = delay_centiseconds(t, video.fps);
    if (control.DelayTime > 65535)  // a 16-bit field
      throw fail(fmt::format("frame {}", t),
                 fmt::format("{} fps needs a delay of {} cs, over the 65535 a GIF frame may have", video.fps,
                             control.DelayTime));
    control.TransparentColor = NO_TRANSPARENT_COLOR;
    GifByteType control_bytes[4];
    EGifGCBToExtension(&control, control_bytes);
    if (EGifPutExtension(encoder.gif, GRAPHICS_EXT_FUNC_CODE, 4, control_bytes) != GIF_OK)
      throw fail(fmt::format("frame {} delay", t), encoder.error());

    // A colour map's size is a power of two; the unused tail stays black.
    int map_size = 2;
    while (map_size < static_cast<int>(frame.colours.size())) map_size *= 2;
    frame.colours.resize(static_cast<size_t>(map_size), GifColorType{0, 0, 0});
    GifColourMap map{GifMakeMapObject(map_size, frame.colours.data())};
    if (!map.map) throw fail(fmt::format("frame {}", t), gif_error_text(E_GIF_ERR_NOT_ENOUGH_MEM));
    if (EGifPutImageDesc(encoder.gif, 0, 0, video.width, video.height, false, map.map) != GIF_OK)
      throw fail(fmt::format("frame {} descriptor", t), encoder.error());
    for (int y = 0; y < video.height; ++y) {
      if (EGifPutLine(encoder.gif, frame.indices.data() + static_cast<size_t>(y) * video.width,
                      video.width) != GIF_OK)
        throw fail(fmt::format("frame {} row {}", t, y), encoder.error());
    }
  }
  int close_error = 0;
  GifFileType* gif = encoder.gif;
  encoder.gif = nullptr;  // EGifCloseFile frees it whatever it returns
  if (EGifCloseFile(gif, &close_error) != GIF_OK) throw fail("closing", gif_error_text(close_error));
  file.commit();
}

}  // namespace loom::data
