// The SIMT emulator that runs Loom's CUDA kernels on the CPU: barriers order shared-memory writes
// before reads, shuffles exchange within the warp by lane index, indices cover the grid, threads
// that return early no longer hold a barrier, and a deadlock or a bad block size is an error.
// Dynamic shared memory starts as NaNs; warp-wide matrix products match a plain product and check
// CUDA's alignment and stride rules.
#include <gtest/gtest.h>

#include "loom/kernels/cuda/simt.h"
#include "loom/kernels/cuda/simt_mma.h"

// The emulator is compiled where the kernels run under it: a CPU-only build, and the emulated copy
// of a CUDA build's kernels (loom_kernels_simt_tests).
#if !defined(LOOM_WITH_CUDA) || defined(LOOM_SIMT_EMULATION)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

namespace LOOM_CUDA_NAMESPACE::simt {
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

TEST(SimtEmulator, DynamicSharedMemoryIsAlignedAndStartsAsNaN) {
  std::vector<float> first(64);
  emulate(
      {2}, 64,
      [&] {
        float* shared = reinterpret_cast<float*>(dynamic_shared());
        EXPECT_EQ(reinterpret_cast<uintptr_t>(shared) % 128, 0U);
        if (block_index().x == 1) first[thread_id()] = shared[thread_id()];  // block 0's writes do not show
        sync_threads();
        shared[thread_id()] = 1;
      },
      64 * sizeof(float));
  for (float x : first) EXPECT_TRUE(std::isnan(x));
}

// One warp: C + A B with B read row-major and A B^T with B read as its transpose, bf16 operands of
// small integers over 4 (exact in bf16 and in fp32 sums), strides 24 and 20 (padded rows).
TEST(SimtEmulator, WarpMatrixProductsMatchAPlainProduct) {
  alignas(32) c10::BFloat16 a[16 * 24], b[16 * 24];
  alignas(32) float c[16 * 20], sum[16 * 20], transposed[16 * 20], rows[16 * 20];
  for (int i = 0; i < 16 * 24; ++i) {
    a[i] = static_cast<float>(i * 7 % 13 - 6) / 4;
    b[i] = static_cast<float>(i * 5 % 11 - 5) / 4;
  }
  for (int i = 0; i < 16 * 20; ++i) c[i] = static_cast<float>(i % 9);
  emulate({1}, 32, [&] {
    mma::MatrixA<c10::BFloat16> fa;
    mma::MatrixB<c10::BFloat16> fb;
    mma::MatrixBT<c10::BFloat16> fbt;
    mma::load(fa, a, 24);
    mma::load(fb, b, 24);
    mma::load(fbt, b, 24);
    mma::Accumulator acc, acc_t, index;
    mma::load(acc, c, 20);
    mma::multiply_add(acc, fa, fb);
    mma::store(sum, acc, 20);
    mma::zero(acc_t);
    mma::multiply_add(acc_t, fa, fbt);
    mma::store(transposed, acc_t, 20);
    // A fragment of row indices: each element learns its row (the kernels' index fragments).
    for (int e = thread_id(); e < 256; e += 32) rows[(e / 16) * 20 + e % 16] = static_cast<float>(e / 16);
    sync_warp();
    mma::load(index, rows, 20);
    for (int i = 0; i < index.num_elements; ++i) acc.x[i] = index.x[i] * 100 + acc.x[i] * 0;
    mma::store(rows, acc, 20);
  });
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float want = c[r * 20 + n], want_t = 0;
      for (int k = 0; k < 16; ++k) {
        want += static_cast<float>(a[r * 24 + k]) * static_cast<float>(b[k * 24 + n]);
        want_t += static_cast<float>(a[r * 24 + k]) * static_cast<float>(b[n * 24 + k]);
      }
      EXPECT_EQ(sum[r * 20 + n], want) << r << " " << n;
      EXPECT_EQ(transposed[r * 20 + n], want_t) << r << " " << n;
      EXPECT_EQ(rows[r * 20 + n], static_cast<float>(r * 100)) << r << " " << n;
    }
}

TEST(SimtEmulator, WarpMatrixOperationsCheckCudasRules) {
  alignas(32) float scratch[16 * 20] = {};
  alignas(32) c10::BFloat16 half[16 * 24] = {};
  auto fails = [](const std::function<void()>& body) {
    EXPECT_THROW(emulate({1}, 32, body), std::logic_error);
  };
  fails([&] {
    mma::Accumulator c;
    mma::load(c, scratch + 1, 20);  // 4-byte aligned only
  });
  fails([&] {
    mma::MatrixA<c10::BFloat16> a;
    mma::load(a, half, 20);  // 16-bit strides are multiples of 8
  });
  fails([&] {
    mma::Accumulator c;
    mma::store(scratch, c, 18);  // fp32 strides are multiples of 4
  });
  fails([&] {  // a product after some of the warp's lanes returned
    if (thread_id() >= 16) return;
    mma::MatrixA<c10::BFloat16> a;
    mma::MatrixB<c10::BFloat16> b;
    mma::Accumulator c;
    mma::load(a, half, 24);
    mma::load(b, half, 24);
    mma::zero(c);
    mma::multiply_add(c, a, b);
  });
}

}  // namespace
}  // namespace LOOM_CUDA_NAMESPACE::simt

#else

TEST(SimtEmulator, NotBuiltWithCuda) {
  GTEST_SKIP() << "CUDA build: the emulator's tests are emulated.SimtEmulator.*";
}

#endif
