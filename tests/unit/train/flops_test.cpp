#include "loom/train/flops.h"

#include <gtest/gtest.h>

#include <cmath>

namespace loom::train {
namespace {

// Speed depends on the machine, so only the sign and finiteness are checked.
TEST(MeasureSgemmFlops, ReturnsPositive) {
  const double flops = measure_sgemm_flops(at::kCPU, 256, 2);
  EXPECT_GT(flops, 0.0);
  EXPECT_TRUE(std::isfinite(flops));
}

}  // namespace
}  // namespace loom::train
