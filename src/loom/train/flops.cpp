#include "loom/train/flops.h"

#include <algorithm>
#include <chrono>
#include <limits>

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

}  // namespace loom::train
