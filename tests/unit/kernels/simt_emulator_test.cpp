// The SIMT emulator that runs Loom's CUDA kernels on the CPU: barriers order shared-memory writes
// before reads, shuffles exchange within the warp by lane index, indices cover the grid, threads
// that return early no longer hold a barrier, and a deadlock or a bad block size is an error.
#include <gtest/gtest.h>

#include "loom/kernels/cuda/simt.h"

#if !defined(LOOM_WITH_CUDA)

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace loom::kernels::cuda::simt {
namespace {

TEST(SimtEmulator, BarrierOrdersSharedMemory) {
  std::vector<int> out(2 * 64);
  emulate({2}, 64, [&] {
    LOOM_SHARED int slots[64];
    const int t = thread_id();
    slots[t] = t * 10 + static_cast<int>(block_index().x);
    sync_threads();
    // Read a slot another thread wrote (in another warp for half of them).
    out[block_index().x * 64 + t] = slots[63 - t];
  });
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 64; ++t) EXPECT_EQ(out[b * 64 + t], (63 - t) * 10 + b) << b << " " << t;
}

// Without a barrier between them, a write and another thread's read are unordered; the emulator's
// scheduling leaves some reads before the writes, so the race shows as stale values.
TEST(SimtEmulator, AMissingBarrierShowsAsAStaleRead) {
  std::vector<int> out(64);
  emulate({1}, 64, [&] {
    LOOM_SHARED int slots[64];
    const int t = thread_id();
    slots[t] = -1;
    sync_threads();
    slots[t] = t;
    out[t] = slots[(t + 1) % 64];  // a race: no barrier between the writes and this read
  });
  EXPECT_GT(std::count(out.begin(), out.end(), -1), 0);
}

TEST(SimtEmulator, ShuffleXorExchangesWithinTheWarp) {
  std::vector<float> partner(64), sums(64);
  emulate({1}, 64, [&] {
    const int t = thread_id();
    partner[t] = shuffle_xor(static_cast<float>(t), 5);
    sums[t] = group_sum<8>(static_cast<float>(t));
  });
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(partner[t], static_cast<float>(t ^ 5));
    const int first = t / 8 * 8;
    EXPECT_EQ(sums[t], static_cast<float>(8 * first + 28)) << t;  // first + ... + first + 7
  }
}

TEST(SimtEmulator, IndicesCoverTheGrid) {
  std::vector<int> seen(3 * 2 * 2 * 32, 0);
  emulate({3, 2, 2}, 32, [&] {
    const Dim b = block_index(), g = grid_size();
    EXPECT_EQ(g.x * g.y * g.z, 12U);
    EXPECT_EQ(block_threads(), 32);
    ++seen[((b.z * 2 + b.y) * 3 + b.x) * 32 + thread_id()];
  });
  for (int n : seen) EXPECT_EQ(n, 1);
}

TEST(SimtEmulator, ThreadsThatReturnNoLongerHoldTheBarrier) {
  int after = 0;
  emulate({1}, 64, [&] {
    if (thread_id() >= 40) return;
    sync_threads();
    ++after;
  });
  EXPECT_EQ(after, 40);
}

TEST(SimtEmulator, DeadlocksAndBadBlocksAreErrors) {
  // Half of a warp waits at the block barrier, the other half in a shuffle that needs the whole
  // warp: neither barrier can open.
  EXPECT_THROW(emulate({1}, 64,
                       [&] {
                         if (thread_id() < 16)
                           sync_threads();
                         else
                           shuffle_xor(1.0F, 1);
                       }),
               std::logic_error);
  EXPECT_THROW(emulate({1}, 48, [] {}), std::logic_error);
  // The emulator is usable again after an error.
  int runs = 0;
  emulate({2}, 32, [&] { ++runs; });
  EXPECT_EQ(runs, 64);
}

}  // namespace
}  // namespace loom::kernels::cuda::simt

#else

TEST(SimtEmulator, NotBuiltWithCuda) { GTEST_SKIP() << "CUDA build: the kernels run on the GPU"; }

#endif
