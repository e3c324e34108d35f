// Demuxing and decoding run in this thread (one decoder thread: the loader's workers already decode
// samples side by side); swscale converts each sampled frame straight into the output clip.
#include "loom/data/video/video_decode.h"

#ifdef LOOM_WITH_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avstring.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}
#endif
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "loom/data/image/decode.h"
#include "loom/util/errors.h"
#ifdef LOOM_WITH_FFMPEG
#include "loom/data/video/libav_error.h"
#include "loom/data/video/libav_handles.h"
#endif
#include "loom/util/filesystem.h"

namespace loom::data {
#ifdef LOOM_WITH_FFMPEG
namespace {

// Two time stamps this close are the same instant: sample times are computed in doubles, source
// time stamps in the stream's time base, and a frame at exactly a sample's time must be taken.
constexpr double kSameInstantSeconds = 1e-6;

struct InputDeleter {
  void operator()(AVFormatContext* context) const { avformat_close_input(&context); }
};
struct IoDeleter {
  void operator()(AVIOContext* io) const { avio_closep(&io); }
};

// The frame's duration in its stream's time base (0 when unknown); FFmpeg 6 renamed the field.
int64_t frame_duration(const AVFrame* frame) {
#if LIBAVUTIL_VERSION_MAJOR >= 58
  return frame->duration;
#else
  return frame->pkt_duration;
#endif
}

bool is_full_range_yuv_format(int format) {
  return format == AV_PIX_FMT_YUVJ420P || format == AV_PIX_FMT_YUVJ422P || format == AV_PIX_FMT_YUVJ444P ||
         format == AV_PIX_FMT_YUVJ440P || format == AV_PIX_FMT_YUVJ411P;
}

// Converts decoded frames of any pixel format and size to (height, width, 3) RGB: resized
// (bilinear) until both sides cover the output, then centre-cropped. Rebuilds its scaler when the
// source's size, format or colour description changes mid-stream.
class FrameConverter {
 public:
  FrameConverter(int height, int width) : height_(height), width_(width) {}

  // False when swscale cannot convert the frame's pixel format.
  bool convert(const AVFrame* frame, uint8_t* out) {
    prepare(frame);
    if (!scaler_) return false;
    if (scaled_height_ == height_ && scaled_width_ == width_) {
      uint8_t* planes[1] = {out};
      const int strides[1] = {width_ * 3};
      sws_scale(scaler_.get(), frame->data, frame->linesize, 0, frame->height, planes, strides);
      return true;
    }
    scaled_.resize(static_cast<size_t>(scaled_height_) * scaled_width_ * 3);
    uint8_t* planes[1] = {scaled_.data()};
    const int strides[1] = {scaled_width_ * 3};
    sws_scale(scaler_.get(), frame->data, frame->linesize, 0, frame->height, planes, strides);
    const int top = (scaled_height_ - height_) / 2, left = (scaled_width_ - width_) / 2;
    for (int y = 0; y < height_; ++y)
      std::memcpy(out + static_cast<size_t>(y) * width_ * 3,
                  scaled_.data() + (static_cast<size_t>(top + y) * scaled_width_ + left) * 3,
                  static_cast<size_t>(width_) * 3);
    return true;
  }

 private:
  void prepare(const AVFrame* frame) {
    const bool same = scaler_ && frame->width == source_width_ && frame->height == source_height_ &&
                      frame->format == source_format_ && frame->colorspace == source_colorspace_ &&
                      frame->color_range == source_range_;
    if (same) return;
    source_width_ = frame->width;
    source_height_ = frame->height;
    source_format_ = frame->format;
    source_colorspace_ = frame->colorspace;
    source_range_ = frame->color_range;
    // The smallest size covering height_ x width_ at the source's aspect ratio.
    const double scale =
        std::max(static_cast<double>(height_) / frame->height, static_cast<double>(width_) / frame->width);
    scaled_height_ = std::max(height_, static_cast<int>(std::lround(frame->height * scale)));
    scaled_width_ = std::max(width_, static_cast<int>(std::lround(frame->width * scale)));
    // Full chroma interpolation: 4:2:0 chroma is upsampled smoothly rather than repeated per pair.
    scaler_.reset(sws_getContext(
        frame->width, frame->height, static_cast<AVPixelFormat>(frame->format), scaled_width_, scaled_height_,
        AV_PIX_FMT_RGB24, SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, nullptr, nullptr, nullptr));
    if (!scaler_) return;
    const AVPixFmtDescriptor* description = av_pix_fmt_desc_get(static_cast<AVPixelFormat>(frame->format));
    const bool yuv = description && description->nb_components >= 3 &&
                     !(description->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL));
    if (yuv) {
      // The matrix and range the stream declares (swscale's table is indexed by AVColorSpace;
      // unspecified falls back to BT.601), to full-range RGB.
      const int full_range =
          frame->color_range == AVCOL_RANGE_JPEG || is_full_range_yuv_format(frame->format);
      sws_setColorspaceDetails(scaler_.get(), sws_getCoefficients(frame->colorspace), full_range,
                               sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
    }
  }

 private:
  const int height_, width_;
  int scaled_height_ = 0, scaled_width_ = 0;
  int source_width_ = 0, source_height_ = 0, source_format_ = -1, source_colorspace_ = -1, source_range_ = -1;
  libav::Scaler scaler_;
  std::vector<uint8_t> scaled_;
};

}  // namespace
#endif

void check_video_sampling(const VideoSampling& sampling) {
  if (sampling.frames < 1)
    throw ConfigError(fmt::format("video sampling: frames must be >= 1, got {}", sampling.frames));
  if (!std::isfinite(sampling.fps) || sampling.fps <= 0)
    throw ConfigError(fmt::format("video sampling: fps must be a positive number, got {}", sampling.fps));
  const bool keep_size = sampling.height == 0 && sampling.width == 0;
  if (!keep_size && (sampling.height < 1 || sampling.width < 1))
    throw ConfigError(fmt::format(
        "video sampling: height and width must both be >= 1 (or both 0 to keep the source's size), got {}x{}",
        sampling.height, sampling.width));
  if (static_cast<uint64_t>(sampling.height) * static_cast<uint64_t>(sampling.width) > kMaxImagePixels)
    throw ConfigError(fmt::format("video sampling: {}x{} is more than the {} pixels a frame may have",
                                  sampling.height, sampling.width, kMaxImagePixels));
}

#ifdef LOOM_WITH_FFMPEG
Video decode_video(const std::string& path, const VideoSampling& sampling) {
  check_video_sampling(sampling);
  auto fail = [&path](const std::string& reason) {
    return DataError(fmt::format("cannot decode video {}: {}", path, reason));
  };
  // A directory or a device is refused before FFmpeg sees it: /dev/zero would be read forever.
  if (const std::string why = unreadable_file_reason(path); !why.empty()) throw fail("it " + why);
  std::error_code size_error;
  if (std::filesystem::file_size(path, size_error) == 0 && !size_error) throw fail("it is empty (0 bytes)");

  capture_libav_log();
  clear_libav_log();
  // "file:" keeps a colon in the path from naming another protocol.
  const std::string url = "file:" + path;

  // Find the container from the file's bytes first, so that only kVideoContainers are ever opened.
  const AVInputFormat* container = nullptr;
  {
    AVIOContext* raw_io = nullptr;
    int rc = avio_open2(&raw_io, url.c_str(), AVIO_FLAG_READ, nullptr, nullptr);
    if (rc < 0) throw fail("cannot open it: " + libav_error_text(rc));
    std::unique_ptr<AVIOContext, IoDeleter> io(raw_io);
    rc = av_probe_input_buffer2(io.get(), &container, path.c_str(), nullptr, 0, 0);
    if (rc < 0 || !container)
      throw fail("FFmpeg recognises no video format in it: " +
                 libav_error_text(rc < 0 ? rc : AVERROR_INVALIDDATA));
  }
  if (av_match_list(container->name, kVideoContainers, ',') <= 0)
    throw fail(fmt::format("it is a '{}' file ({}), not one of the containers Loom decodes ({})",
                           container->name, container->long_name ? container->long_name : "?",
                           kVideoContainers));

  AVFormatContext* raw_input = nullptr;
  libav::Dictionary input_options;
  av_dict_set(&input_options.entries, "protocol_whitelist", "file", 0);
  int rc = avformat_open_input(&raw_input, url.c_str(), container, &input_options.entries);
  if (rc < 0) throw fail(fmt::format("cannot read it as {}: {}", container->name, libav_error_text(rc)));
  std::unique_ptr<AVFormatContext, InputDeleter> input(raw_input);

  auto check_pixel_budget = [&](int64_t width, int64_t height, const char* what) {
    if (width > 0 && height > 0 &&
        static_cast<uint64_t>(width) * static_cast<uint64_t>(height) > kMaxImagePixels)
      throw fail(
          fmt::format("{} {}x{} = {} pixels, more than the {} a frame may have (a corrupt file or a "
                      "decompression bomb)",
                      what, width, height, width * height, kMaxImagePixels));
  };
  // The sizes the headers declare are checked before any frame is decoded (probing included):
  // a GIF may declare a 65535x65535 screen in ten bytes.
  for (unsigned i = 0; i < input->nb_streams; ++i)
    if (input->streams[i]->codecpar->codec_type == AVMEDIA_TYPE_VIDEO)
      check_pixel_budget(input->streams[i]->codecpar->width, input->streams[i]->codecpar->height,
                         "its header declares frames of");
  {
    // Probing decodes a few frames; max_pixels makes any larger one a decoding error.
    std::vector<AVDictionary*> stream_options(input->nb_streams, nullptr);
    for (AVDictionary*& options : stream_options) av_dict_set_int(&options, "max_pixels", kMaxImagePixels, 0);
    rc = avformat_find_stream_info(input.get(), stream_options.empty() ? nullptr : stream_options.data());
    for (AVDictionary*& options : stream_options) av_dict_free(&options);
    if (rc < 0) throw fail("cannot find its streams: " + libav_error_text(rc));
  }

  const AVCodec* decoder = nullptr;
  const int stream_index = av_find_best_stream(input.get(), AVMEDIA_TYPE_VIDEO, -1, -1, &decoder, 0);
  if (stream_index == AVERROR_DECODER_NOT_FOUND) throw fail("FFmpeg has no decoder for its video stream");
  if (stream_index < 0) throw fail("it has no video stream");
  AVStream* stream = input->streams[stream_index];
  if (stream->disposition & AV_DISPOSITION_ATTACHED_PIC)
    throw fail("its only video stream is an attached picture (cover art), not a video");
  check_pixel_budget(stream->codecpar->width, stream->codecpar->height, "its video stream has frames of");
  for (unsigned i = 0; i < input->nb_streams; ++i)
    if (static_cast<int>(i) != stream_index) input->streams[i]->discard = AVDISCARD_ALL;

  libav::Codec context(avcodec_alloc_context3(decoder));
  if (!context) throw fail("cannot allocate a decoder");
  rc = avcodec_parameters_to_context(context.get(), stream->codecpar);
  if (rc < 0) throw fail("cannot set up the decoder: " + libav_error_text(rc));
  context->pkt_timebase = stream->time_base;
  context->max_pixels = static_cast<int64_t>(kMaxImagePixels);
  context->thread_count = 1;
  rc = avcodec_open2(context.get(), decoder, nullptr);
  if (rc < 0) throw fail(fmt::format("cannot open the {} decoder: {}", decoder->name, libav_error_text(rc)));

  libav::Packet packet(av_packet_alloc());
  libav::Frame decoded(av_frame_alloc());
  libav::Frame held(av_frame_alloc());  // the latest frame taken
  if (!packet || !decoded || !held) throw fail("cannot allocate a frame");

  const double time_base = av_q2d(stream->time_base);
  Video video{sampling.frames, sampling.height, sampling.width, sampling.fps, {}};
  if (sampling.whole_video) {
    const double duration = stream->duration != AV_NOPTS_VALUE && stream->duration > 0
                                ? static_cast<double>(stream->duration) * time_base
                            : input->duration != AV_NOPTS_VALUE && input->duration > 0
                                ? static_cast<double>(input->duration) / AV_TIME_BASE
                                : 0.0;
    if (duration > 0) {  // else frames at fps until the file ends
      const double at_fps = std::floor(duration * sampling.fps + 1e-9);
      if (at_fps > sampling.frames)
        video.fps = sampling.frames / duration;
      else
        video.frames = std::max(1, static_cast<int>(at_fps));
    }
  }
  const double fps = video.fps;
  std::unique_ptr<FrameConverter> converter;
  int next_sample = 0;
  int64_t frames_taken = 0, packets_read = 0;
  bool have_held = false;
  double start = 0, held_time = 0, held_duration = 0;  // seconds; times are relative to start
  int64_t held_number = -1, last_converted = -1;       // which source frame is held / was converted

  // Fills every sample before `time` with the held frame.
  auto sample_before = [&](double time) {
    for (; next_sample < video.frames && next_sample / fps + kSameInstantSeconds < time; ++next_sample) {
      if (held_number == last_converted) {
        std::memcpy(video.frame(next_sample), video.frame(next_sample - 1), video.frame_bytes());
      } else {
        if (!converter->convert(held.get(), video.frame(next_sample))) {
          const char* format = av_get_pix_fmt_name(static_cast<AVPixelFormat>(held->format));
          throw fail(fmt::format("swscale cannot convert its pixel format {} to RGB", format ? format : "?"));
        }
        last_converted = held_number;
      }
    }
  };
  // Takes one decoded frame: it ends the held frame's time on screen.
  auto take = [&](AVFrame* frame) {
    if ((frame->flags & AV_FRAME_FLAG_CORRUPT) || frame->decode_error_flags)
      throw fail(fmt::format("frame {} was decoded with errors (corrupt data): {}", frames_taken,
                             libav_error_text(AVERROR_INVALIDDATA)));
    check_pixel_budget(frame->width, frame->height, "it decodes to frames of");
    double time;
    if (frame->best_effort_timestamp != AV_NOPTS_VALUE) {
      const double absolute = frame->best_effort_timestamp * time_base;
      if (!have_held) start = absolute;
      time = absolute - start;
    } else if (!have_held) {
      time = 0;
    } else if (held_duration > 0) {
      time = held_time + held_duration;
    } else {
      throw fail(fmt::format("frame {} has no time stamp, nor its predecessor a duration", frames_taken));
    }
    // A frame that does not move time forward (a duplicate stamp) never shows: it is skipped.
    if (have_held && time <= held_time) {
      av_frame_unref(frame);
      return;
    }
    if (!have_held) {
      if (video.height == 0) {
        video.height = frame->height;
        video.width = frame->width;
      }
      video.rgb.resize(static_cast<size_t>(video.frames) * video.frame_bytes());
      converter = std::make_unique<FrameConverter>(video.height, video.width);
    } else {
      sample_before(time);
    }
    av_frame_unref(held.get());
    av_frame_move_ref(held.get(), frame);
    have_held = true;
    held_time = time;
    held_duration = frame_duration(held.get()) * time_base;
    held_number = frames_taken++;
  };
  // Takes every frame the decoder has ready.
  auto drain = [&] {
    for (;;) {
      const int received = avcodec_receive_frame(context.get(), decoded.get());
      if (received == AVERROR(EAGAIN) || received == AVERROR_EOF) return;
      if (received < 0) throw fail("decoding failed: " + libav_error_text(received));
      take(decoded.get());
    }
  };

  bool ended = false;
  while (next_sample < video.frames && !ended) {
    rc = av_read_frame(input.get(), packet.get());
    if (rc == AVERROR_EOF) {
      ended = true;
      rc = avcodec_send_packet(context.get(), nullptr);  // flush the frames the decoder holds back
    } else if (rc < 0) {
      throw fail("cannot read it: " + libav_error_text(rc));
    } else if (packet->stream_index != stream_index) {
      av_packet_unref(packet.get());
      continue;
    } else {
      ++packets_read;
      if (packet->flags & AV_PKT_FLAG_CORRUPT)
        throw fail(
            fmt::format("packet {} is corrupt: {}", packets_read - 1, libav_error_text(AVERROR_INVALIDDATA)));
      rc = avcodec_send_packet(context.get(), packet.get());
      av_packet_unref(packet.get());
    }
    if (rc < 0) throw fail("decoding failed: " + libav_error_text(rc));
    drain();
  }
  if (next_sample == video.frames) return video;

  // The file ended before the last sample: it was truncated, or is too short.
  if (stream->nb_frames > 0 && packets_read < stream->nb_frames)
    throw fail(fmt::format("it ends after {} of the {} frames its index lists (a truncated file)",
                           packets_read, stream->nb_frames));
  if (!have_held) throw fail("it has no frames that decode");
  const AVRational guessed_rate = av_guess_frame_rate(input.get(), stream, nullptr);
  double last_duration = held_duration;
  if (last_duration <= 0 && guessed_rate.num > 0 && guessed_rate.den > 0)
    last_duration = 1 / av_q2d(guessed_rate);
  if (last_duration <= 0 && frames_taken > 1) last_duration = held_time / (frames_taken - 1);
  const double end = held_time + last_duration;
  sample_before(end);
  if (next_sample == video.frames) return video;
  if (sampling.whole_video && next_sample > 0) {  // its duration said more than its frames show
    video.frames = next_sample;
    video.rgb.resize(static_cast<size_t>(video.frames) * video.frame_bytes());
    return video;
  }
  const double source_fps = end > 0 ? frames_taken / end : 0;
  throw fail(fmt::format(
      "it has {} frames at {:.4g} fps ({:.4g} s), too short for {} frames at {:.4g} fps (the "
      "last at {:.4g} s)",
      frames_taken, source_fps, end, video.frames, sampling.fps, (video.frames - 1) / sampling.fps));
}
#else
Video decode_video(const std::string& path, const VideoSampling& sampling) {
  check_video_sampling(sampling);
  throw DataError(
      fmt::format("{}: cannot decode: this Loom was built without FFmpeg's libraries (libavformat-dev, "
                  "libavcodec-dev, libavutil-dev, libswscale-dev: scripts/setup.sh installs them)",
                  path));
}
#endif

}  // namespace loom::data
