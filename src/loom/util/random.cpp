// The keyed Feistel permutation of [0, n).
#include "loom/util/random.h"

#include <fmt/format.h>

#include "loom/util/errors.h"

namespace loom {

uint64_t permute_index(uint64_t i, uint64_t n, uint64_t key) {
  if (i >= n) throw DataError(fmt::format("permute_index: index {} is outside [0, {})", i, n));
  if (n == 1) return 0;
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  const int half = (bits + 1) / 2;  // the domain is 2^(2*half) >= n, at most 4n
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = i;
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t next = left ^ (splitmix64(right ^ splitmix64(key + round)) & mask);
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= n);
  return x;
}

}  // namespace loom
