#include "loom/data/video/mp4_writer.h"

#ifdef LOOM_WITH_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}
#endif
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "loom/data/video/staged_file.h"
#include "loom/util/errors.h"
#ifdef LOOM_WITH_FFMPEG
#include "loom/data/video/libav_error.h"
#include "loom/data/video/libav_handles.h"
#endif

namespace loom::data {
#ifdef LOOM_WITH_FFMPEG
namespace {

// Owners of FFmpeg's objects, each freed by its own function.
struct OutputDeleter {
  void operator()(AVFormatContext* context) const {
    if (context->pb) avio_closep(&context->pb);
    avformat_free_context(context);
  }
};

// Frame t of `video` padded to even sides by repeating its last row and column; (height, width, 3).
void pad_frame(const Video& video, int t, int height, int width, std::vector<uint8_t>* out) {
  out->resize(static_cast<size_t>(height) * width * 3);
  const uint8_t* frame = video.frame(t);
  for (int y = 0; y < height; ++y) {
    const uint8_t* source = frame + static_cast<size_t>(std::min(y, video.height - 1)) * video.width * 3;
    uint8_t* row = out->data() + static_cast<size_t>(y) * width * 3;
    std::memcpy(row, source, static_cast<size_t>(video.width) * 3);
    for (int x = video.width; x < width; ++x) std::memcpy(row + 3 * x, source + 3 * (video.width - 1), 3);
  }
}

const AVCodec* find_encoder(Mp4Codec codec) {
  if (codec != Mp4Codec::kMpeg4)
    if (const AVCodec* h264 = avcodec_find_encoder_by_name("libx264")) return h264;
  if (codec == Mp4Codec::kH264) return nullptr;
  return avcodec_find_encoder(AV_CODEC_ID_MPEG4);
}

}  // namespace
#endif

#ifdef LOOM_WITH_FFMPEG
bool h264_encoder_available() { return avcodec_find_encoder_by_name("libx264") != nullptr; }

void write_mp4(const Video& video, const std::string& path, Mp4Codec codec) {
  if (const std::string why = video_shape_error(video); !why.empty())
    throw DataError(fmt::format("cannot write MP4 {}: {}", path, why));
  capture_libav_log();
  clear_libav_log();
  auto fail = [&path](const std::string& step, int code) {
    return DataError(fmt::format("cannot write MP4 {}: {}: {}", path, step, libav_error_text(code)));
  };

  const AVCodec* encoder = find_encoder(codec);
  if (!encoder)
    throw DataError(fmt::format("cannot write MP4 {}: this libavcodec has no {} encoder", path,
                                codec == Mp4Codec::kH264 ? "H.264 (libx264)" : "MPEG-4 Part 2"));
  const bool h264 = encoder->id == AV_CODEC_ID_H264;
  const int height = video.height + video.height % 2, width = video.width + video.width % 2;
  // MPEG-4 Part 2 stores the time base's denominator in 16 bits; every common rate (24, 30000/1001, ...)
  // is exact within that.
  const AVRational rate = av_d2q(video.fps, 65535);
  if (rate.num <= 0 || rate.den <= 0)
    throw DataError(fmt::format("cannot write MP4 {}: {} fps has no usable ratio", path, video.fps));

  StagedFile file(path, "MP4");
  // "file:" keeps a colon in the path from naming another protocol.
  const std::string url = "file:" + file.temporary_path();
  AVFormatContext* raw_output = nullptr;
  // The container is named, not guessed: the temporary file's name has no .mp4 extension.
  int rc = avformat_alloc_output_context2(&raw_output, nullptr, "mp4", url.c_str());
  if (rc < 0 || !raw_output) throw fail("cannot set up the MP4 muxer", rc < 0 ? rc : AVERROR(ENOMEM));
  std::unique_ptr<AVFormatContext, OutputDeleter> output(raw_output);

  libav::Codec context(avcodec_alloc_context3(encoder));
  if (!context) throw fail("cannot allocate the encoder", AVERROR(ENOMEM));
  context->width = width;
  context->height = height;
  context->pix_fmt = AV_PIX_FMT_YUV420P;
  context->time_base = av_inv_q(rate);
  context->framerate = rate;
  // What swscale's RGB->YUV below produces, so players convert back with the same matrix.
  context->color_range = AVCOL_RANGE_MPEG;
  context->colorspace = AVCOL_SPC_SMPTE170M;
  context->color_primaries = AVCOL_PRI_SMPTE170M;
  context->color_trc = AVCOL_TRC_SMPTE170M;
  if (output->oformat->flags & AVFMT_GLOBALHEADER) context->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  libav::Dictionary encoder_options;
  if (h264) {
    av_dict_set(&encoder_options.entries, "crf", "18", 0);  // visually near-lossless
    av_dict_set(&encoder_options.entries, "preset", "medium", 0);
  } else {
    context->flags |= AV_CODEC_FLAG_QSCALE;  // constant quantiser 3: high quality, no bit-rate guess
    context->global_quality = FF_QP2LAMBDA * 3;
  }
  rc = avcodec_open2(context.get(), encoder, &encoder_options.entries);
  if (rc < 0) throw fail(fmt::format("cannot open the {} encoder", encoder->name), rc);

  AVStream* stream = avformat_new_stream(output.get(), nullptr);
  if (!stream) throw fail("cannot add a video stream", AVERROR(ENOMEM));
  rc = avcodec_parameters_from_context(stream->codecpar, context.get());
  if (rc < 0) throw fail("cannot describe the video stream", rc);
  stream->time_base = context->time_base;
  stream->avg_frame_rate = rate;

  rc = avio_open(&output->pb, url.c_str(), AVIO_FLAG_WRITE);
  if (rc < 0) throw fail("cannot open " + file.temporary_path(), rc);
  libav::Dictionary muxer_options;
  av_dict_set(&muxer_options.entries, "movflags", "+faststart", 0);
  rc = avformat_write_header(output.get(), &muxer_options.entries);
  if (rc < 0) throw fail("cannot write the MP4 header", rc);

  libav::Scaler scaler(sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height, AV_PIX_FMT_YUV420P,
                                      SWS_BILINEAR | SWS_ACCURATE_RND, nullptr, nullptr, nullptr));
  if (!scaler) throw fail("cannot set up the RGB to YUV conversion", AVERROR(EINVAL));
  libav::Frame frame(av_frame_alloc());
  libav::Packet packet(av_packet_alloc());
  if (!frame || !packet) throw fail("cannot allocate a frame", AVERROR(ENOMEM));
  frame->format = AV_PIX_FMT_YUV420P;
  frame->width = width;
  frame->height = height;
  frame->color_range = context->color_range;
  frame->colorspace = context->colorspace;
  rc = av_frame_get_buffer(frame.get(), 0);
  if (rc < 0) throw fail("cannot allocate a frame", rc);

  // Sends one frame (nullptr: the end) and writes every packet the encoder has ready.
  auto encode = [&](const AVFrame* input) {
    int sent = avcodec_send_frame(context.get(), input);
    if (sent < 0) throw fail("encoding failed", sent);
    for (;;) {
      const int received = avcodec_receive_packet(context.get(), packet.get());
      if (received == AVERROR(EAGAIN) || received == AVERROR_EOF) return;
      if (received < 0) throw fail("encoding failed", received);
      av_packet_rescale_ts(packet.get(), context->time_base, stream->time_base);
      packet->stream_index = stream->index;
      const int written = av_interleaved_write_frame(output.get(), packet.get());
      if (written < 0) throw fail("cannot write a packet", written);
    }
  };

  std::vector<uint8_t> padded;
  for (int t = 0; t < video.frames; ++t) {
    const uint8_t* rgb = video.frame(t);
    if (height != video.height || width != video.width) {
      pad_frame(video, t, height, width, &padded);
      rgb = padded.data();
    }
    rc = av_frame_make_writable(frame.get());  // the encoder may still hold the previous frame
    if (rc < 0) throw fail("cannot reuse the frame buffer", rc);
    const uint8_t* planes[1] = {rgb};
    const int strides[1] = {width * 3};
    sws_scale(scaler.get(), planes, strides, 0, height, frame->data, frame->linesize);
    frame->pts = t;
    encode(frame.get());
  }
  encode(nullptr);
  rc = av_write_trailer(output.get());  // with faststart, rewrites the file with the index first
  if (rc < 0) throw fail("cannot finish the MP4", rc);
  rc = avio_closep(&output->pb);
  if (rc < 0) throw fail("cannot close " + file.temporary_path(), rc);
  file.commit();
}
#else
bool h264_encoder_available() { return false; }

void write_mp4(const Video& video, const std::string& path, Mp4Codec) {
  if (const std::string why = video_shape_error(video); !why.empty())
    throw DataError(fmt::format("cannot write MP4 {}: {}", path, why));
  throw DataError(
      fmt::format("cannot write MP4 {}: this Loom was built without FFmpeg's libraries (libavformat-dev, "
                  "libavcodec-dev, libavutil-dev, libswscale-dev: scripts/setup.sh installs them)",
                  path));
}
#endif

}  // namespace loom::data
