// Loom's deterministic randomness: splitmix64's mixer, a counter-based stream that (seed, stream,
// index) rebuilds on any run, machine or thread, and a keyed permutation of [0, n) in O(1) memory.
#pragma once
#include <cstdint>

namespace loom {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;  // splitmix64's increment

// splitmix64's output function: a bijective 64-bit mixer, so nearby inputs give unrelated outputs.
inline uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One splitmix64 step from state x: the generator's next output after x.
inline uint64_t splitmix64(uint64_t x) { return mix64(x + kGoldenGamma); }

// A hash of (seed, stream, index): where the counter-based stream of sample `index` starts.
inline uint64_t counter_start(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(mix64(seed + kGoldenGamma) ^ stream) + index);
}

// A splitmix64 stream starting at counter_start(seed, stream, index): sample i draws the same numbers
// on every run, machine and thread, and owns no shared state.
class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream, uint64_t index) : state_(counter_start(seed, stream, index)) {}
  uint64_t next() {
    state_ += kGoldenGamma;
    return mix64(state_);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }  // [0, n)
  int between(int lo, int hi) { return lo + below(hi - lo + 1); }                   // [lo, hi]

 private:
  uint64_t state_;
};

// Pseudo-random permutation of [0, n) keyed by key: a 4-round Feistel network on the smallest
// even-bit domain holding n, walked until it lands inside [0, n). O(1) memory, pure function.
// DataError unless i < n.
uint64_t permute_index(uint64_t i, uint64_t n, uint64_t key);

}  // namespace loom
