// The fp32 master held as its bf16 rounding and a 16-bit residual: every low half under a spread
// of high halves splits into ATen's bf16 rounding and a residual that joins back to the same bits,
// and the plain split (ATen ops) agrees with the fused kernel's per-element codec.
#include "loom/memory/fp32_reuse.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "loom/kernels/cpu/vector.h"
#include "loom/util/errors.h"

namespace loom::memory {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Every 32-bit pattern with one of these high halves: zeros, denormals, the smallest and largest
// normals of both parities and signs, and the halves next to infinity and NaN.
at::Tensor every_low_half() {
  const std::vector<uint32_t> highs = {0x0000, 0x0001, 0x0002, 0x007f, 0x0080, 0x0081, 0x3f80,
                                       0x3f81, 0x4049, 0x404a, 0x7f7e, 0x7f7f, 0x7f80, 0x7fc0,
                                       0x8000, 0x8001, 0xbf80, 0xbf81, 0xff7f, 0xff80, 0xffc1};
  at::Tensor w = at::empty({static_cast<int64_t>(highs.size()), 65536}, at::kInt);
  int32_t* p = w.data_ptr<int32_t>();
  for (size_t h = 0; h < highs.size(); ++h)
    for (uint32_t low = 0; low < 65536; ++low) {
      const uint32_t bits = (highs[h] << 16) | low;
      std::memcpy(p + h * 65536 + low, &bits, sizeof bits);
    }
  return w.view(at::kFloat);
}

TEST(Fp32Reuse, SplitAndJoinRoundTripEveryLowHalf) {
  const at::Tensor w = every_low_half();
  at::Tensor bf16 = at::empty(w.sizes(), at::kBFloat16);
  const SplitMaster split = split_master(w, bf16);
  EXPECT_TRUE(at::equal(bf16.view(at::kShort), w.to(at::kBFloat16).view(at::kShort)));  // ATen's rounding
  ASSERT_EQ(split.residual.scalar_type(), at::kShort);
  EXPECT_EQ(split.bytes(), w.numel() * 2 + static_cast<int64_t>(split.ties.size()) * 8);

  const at::Tensor joined = join_master(bf16, split);
  const float* in = w.data_ptr<float>();
  const float* out = joined.data_ptr<float>();
  const auto* h = reinterpret_cast<const uint16_t*>(bf16.data_ptr<at::BFloat16>());
  const int16_t* r = split.residual.data_ptr<int16_t>();
  size_t next_tie = 0;
  int64_t nan_count = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const bool tie = next_tie < split.ties.size() && split.ties[next_tie] == i;
    if (tie) ++next_tie;
    bool kernel_tie = false;
    if (std::isnan(in[i])) {
      ++nan_count;
      ASSERT_TRUE(std::isnan(out[i])) << i;
      continue;
    }
    ASSERT_EQ(bits_of(out[i]), bits_of(in[i])) << "element " << i;
    // The fused kernel's codec: the same high half, residual and tie flag.
    ASSERT_EQ(kernels::cpu::to_bf16(in[i]), h[i]) << i;
    ASSERT_EQ(kernels::cpu::bf16_residual(in[i], h[i], kernel_tie), r[i]) << i;
    ASSERT_EQ(kernel_tie, tie) << i;
    ASSERT_EQ(bits_of(kernels::cpu::join_bf16(h[i], r[i], tie)), bits_of(in[i])) << i;
  }
  EXPECT_EQ(next_tie, split.ties.size());  // sorted, each index once
  EXPECT_GT(nan_count, 0);
  // A tie rounded down is a low half of exactly 0x8000 under an even high half (0x7f80 and 0xffc1
  // are infinity and a NaN: no ties).
  EXPECT_EQ(split.ties.size(), 8u);
  for (int64_t i : split.ties) EXPECT_EQ(bits_of(in[i]) & 0x1ffffu, 0x8000u) << i;
}

TEST(Fp32Reuse, ANaNStaysANaN) {
  const std::vector<uint32_t> nans = {0x7f800001, 0x7fc00000, 0xff800001, 0x7fffffff};
  at::Tensor w = at::empty({static_cast<int64_t>(nans.size())}, at::kInt);
  for (size_t i = 0; i < nans.size(); ++i) std::memcpy(w.data_ptr<int32_t>() + i, &nans[i], 4);
  at::Tensor bf16 = at::empty({w.numel()}, at::kBFloat16);
  const at::Tensor joined = join_master(bf16, split_master(w.view(at::kFloat), bf16));
  for (int64_t i = 0; i < w.numel(); ++i) {
    EXPECT_TRUE(std::isnan(joined[i].item<float>())) << i;
  }
}

TEST(Fp32Reuse, RejectsMismatchedTensors) {
  at::Tensor bf16 = at::empty({3}, at::kBFloat16);
  EXPECT_THROW(split_master(at::zeros({4}), bf16), ModelError);
  EXPECT_THROW(split_master(at::zeros({3}, at::kDouble), bf16), ModelError);
  SplitMaster split = split_master(at::zeros({3}), bf16);
  EXPECT_THROW(join_master(at::empty({4}, at::kBFloat16), split), ModelError);
}

}  // namespace
}  // namespace loom::memory
