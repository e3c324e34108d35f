// Measured fp32 matmul throughput of this machine: the peak that model FLOP utilisation (MFU) is
// reported against when no vendor peak is known.
#pragma once
#include <ATen/ATen.h>

namespace loom::train {

// Best FLOP/s (2*n^3 / seconds) over `repeats` timed at::mm of two n x n fp32 matrices on `device`,
// after one untimed warm-up.
double measure_sgemm_flops(at::Device device = at::kCPU, int64_t n = 1024, int repeats = 3);

}  // namespace loom::train
