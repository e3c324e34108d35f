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

// The names CUDA reports for each GPU, against the vendors' dense bf16 figures.
TEST(DenseBf16PeakFlops, KnowsTheGpusByTheirCudaNames) {
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA H200 NVL"), 835e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA A100-PCIE-40GB"), 312e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA L40S"), 362e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA L40"), 181e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA L4"), 121e12);
  EXPECT_EQ(dense_bf16_peak_flops("NVIDIA GeForce RTX 4090"), 0.0);
  EXPECT_EQ(dense_bf16_peak_flops("cpu"), 0.0);
}

// training.peak_tflops overrides any table or measurement.
TEST(JobPeakFlops, TheConfiguredPeakWins) {
  EXPECT_EQ(job_peak_flops(123.0, at::kCPU), 123e12);
  EXPECT_GT(job_peak_flops(0.0, at::kCPU), 0.0);
}

}  // namespace
}  // namespace loom::train
