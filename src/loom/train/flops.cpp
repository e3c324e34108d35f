#include "loom/train/flops.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <utility>

#include "loom/core/device.h"

namespace loom::train {

double measure_sgemm_flops(at::Device device, int64_t n, int repeats) {
  at::NoGradGuard no_grad;
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor a = at::randn({n, n}, options);  // (n, n)
  const at::Tensor b = at::randn({n, n}, options);  // (n, n)
  at::Tensor c = at::empty({n, n}, options);        // (n, n)
  // Reading one element back waits for an asynchronous device to finish the product.
  auto run = [&] {
    at::mm_out(c, a, b);
    return c[0][0].item<float>();
  };
  run();  // warm-up: thread pools, allocator, device kernels
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return 2.0 * static_cast<double>(n) * n * n / std::max(best, 1e-9);
}

double dense_bf16_peak_flops(const std::string& device_name) {
  // Vendor datasheets' dense (not 2:4 sparse) bf16 figures, most specific name first.
  static const std::pair<const char*, double> kPeaks[] = {
      {"H200 NVL", 835e12}, {"H100 NVL", 835e12}, {"H100 PCIe", 756e12}, {"H200", 989e12},
      {"H100", 989e12},     {"H800", 989e12},     {"A100", 312e12},      {"A800", 312e12},
      {"L40S", 362e12},     {"L40", 181e12},      {"A10G", 70e12},       {"L4", 121e12}};
  for (const auto& [name, flops] : kPeaks)
    if (device_name.find(name) != std::string::npos) return flops;
  return 0;
}

double job_peak_flops(double peak_tflops, const at::Device& device) {
  if (peak_tflops > 0) return peak_tflops * 1e12;
  if (device.is_cuda()) {
    const std::string name = core::device_name(device);
    if (const double peak = dense_bf16_peak_flops(name); peak > 0) {
      spdlog::info("MFU against {}'s dense bf16 peak, {:.0f} TFLOP/s", name, peak / 1e12);
      return peak;
    }
    spdlog::warn(
        "{} is not in Loom's table of GPU peaks: MFU is against its measured fp32 product rate (set "
        "training.peak_tflops)",
        name);
  }
  return measure_sgemm_flops(device);
}

}  // namespace loom::train
