#include "loom/data/video/libav_error.h"

#ifdef LOOM_WITH_FFMPEG  // its only users, the MP4 writer and the video decoder, need FFmpeg too
extern "C" {
#include <libavutil/error.h>
#include <libavutil/log.h>
}

#include <cstdarg>
#include <mutex>

namespace loom::data {
namespace {

thread_local std::string last_logged_error;

void record_error(void* context, int level, const char* format, va_list arguments) {
  if (level > AV_LOG_ERROR) return;
  // FFmpeg's own prefix carries the context's address ("[h264 @ 0x5581...]"); the component's
  // name alone says which part failed, and keeps messages the same from run to run.
  char line[512];
  int print_prefix = 0;
  av_log_format_line2(context, level, format, arguments, line, sizeof(line), &print_prefix);
  std::string text = line;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty()) return;
  const AVClass* const* component = static_cast<const AVClass* const*>(context);
  if (component && *component && (*component)->item_name)
    text = std::string((*component)->item_name(context)) + ": " + text;
  last_logged_error = text;
}

}  // namespace

void capture_libav_log() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_callback(record_error); });
}

void clear_libav_log() { last_logged_error.clear(); }

std::string libav_error_text(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, text, sizeof(text));
  std::string out = text;
  if (!last_logged_error.empty()) out += "; FFmpeg: " + last_logged_error;
  return out;
}

}  // namespace loom::data

#endif  // LOOM_WITH_FFMPEG
