// Wall-clock seconds for the timings Loom reports (step times, waits, the bench's split).
#pragma once
#include <chrono>

namespace loom {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace loom
