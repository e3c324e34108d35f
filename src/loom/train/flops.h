// Measured fp32 matmul throughput of this machine: the peak that model FLOP utilisation (MFU) is
// reported against when no vendor peak is known.
#pragma once
#include <ATen/ATen.h>

namespace loom::train {

// Best FLOP/s (2*n^3 / seconds) over `repeats` timed at::mm of two n x n fp32 matrices on `device`,
// after one untimed warm-up.
double measure_sgemm_flops(at::Device device = at::kCPU, int64_t n = 1024, int repeats = 3);

// A GPU's dense bf16 tensor-core peak in FLOP/s, from its name as CUDA reports it ("NVIDIA H200",
// "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"); 0 for a name not in the table.
double dense_bf16_peak_flops(const std::string& device_name);

// What MFU is reported against: training.peak_tflops when set; on a GPU, its dense bf16 peak from
// the table (else its measured fp32 product rate); on the CPU, the measured fp32 product rate.
double job_peak_flops(double peak_tflops, const at::Device& device);

}  // namespace loom::train
