// FFmpeg's failures as text for Loom's errors: the message of an AVERROR code, and what FFmpeg
// itself logged ("moov atom not found"), which says far more than the code alone.
#pragma once
#include <string>

namespace loom::data {

// Routes FFmpeg's log to a per-thread record of its last error instead of stderr (process-wide,
// installed once; later calls do nothing). A corrupt sample then shows up once, in the DataError
// that skips it, not as decoder chatter in the training log. Messages below error level are dropped.
void capture_libav_log();

// Forgets the error this thread recorded, before a call whose failure is to be explained.
void clear_libav_log();

// "<what av_strerror says about code>", followed by "; FFmpeg: <last logged error>" when this thread
// recorded one since clear_libav_log().
std::string libav_error_text(int code);

}  // namespace loom::data
