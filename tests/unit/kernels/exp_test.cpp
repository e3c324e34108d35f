// The vectorised exponential against std::exp over the range the kernels use (scores minus their
// maximum: from -100 to 0, and -inf), to 3e-7 relative; and the same bits from its vector loop as
// from its scalar tail (no fused multiply-add in one and not the other).
#include "loom/kernels/cpu/exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace loom::kernels::cpu {
namespace {

TEST(ExpInPlace, MatchesStdExp) {
  std::vector<float> x;
  for (float v = -100.0F; v <= 0.0F; v += 0.0137F) x.push_back(v);
  x.push_back(0.0F);
  x.push_back(-std::numeric_limits<float>::infinity());
  std::vector<float> y = x;
  exp_in_place(y.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    if (x[i] < -87.0F) {
      EXPECT_EQ(y[i], 0.0F) << x[i];  // below fp32's normal range
    } else {
      EXPECT_NEAR(y[i], want, 3e-7 * want) << x[i];
    }
  }
}

TEST(ExpInPlace, VectorLoopAndScalarTailGiveTheSameBits) {
  std::vector<float> x;
  for (float v = -90.0F; v <= 0.0F; v += 0.0371F) x.push_back(v);
  std::vector<float> bulk = x;
  exp_in_place(bulk.data(), static_cast<int64_t>(bulk.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    float one = x[i];
    exp_in_place(&one, 1);
    EXPECT_EQ(one, bulk[i]) << x[i];
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
