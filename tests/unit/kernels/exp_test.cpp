// The vectorised exponential against std::exp over the range the kernels use (scores minus their
// maximum: from -100 to 0, and -inf), to 3e-7 relative.
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

}  // namespace
}  // namespace loom::kernels::cpu
