#include "loom/kernels/cpu/gemm.h"

#include <ATen/ATen.h>
#include <dlfcn.h>

namespace loom::kernels::cpu {

namespace {

// CBLAS's interface (row-major = 101, no transpose = 111, transpose = 112).
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                            float*, int);

CblasSgemm find_cblas_sgemm() {
  static const CblasSgemm fn = reinterpret_cast<CblasSgemm>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  return fn;
}

using GetThreads = int (*)();
using SetThreads = void (*)(int);

}  // namespace

SingleThreadedBlas::SingleThreadedBlas() {
  static const auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  static const auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get && set && (previous_ = get()) > 1) set(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  static const auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set && previous_ > 1) set(previous_);
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (const CblasSgemm sgemm = find_cblas_sgemm()) {
    sgemm(101, transpose_a ? 112 : 111, transpose_b ? 112 : 111, static_cast<int>(m), static_cast<int>(n),
          static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
          static_cast<int>(ldc));
    return;
  }
  at::NoGradGuard no_grad;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  auto matrix = [&](const float* p, bool transpose, int64_t rows, int64_t cols, int64_t ld) {
    // op(X) is rows x cols; X as stored is cols x rows when transposed.
    at::Tensor x = transpose ? at::from_blob(const_cast<float*>(p), {cols, rows}, {ld, 1}, f32).t()
                             : at::from_blob(const_cast<float*>(p), {rows, cols}, {ld, 1}, f32);
    return x;
  };
  at::Tensor out = at::from_blob(c, {m, n}, {ldc, 1}, f32);
  at::Tensor product = at::mm(matrix(a, transpose_a, m, k, lda), matrix(b, transpose_b, k, n, ldb));
  if (beta == 0.0F) {
    out.copy_(product.mul_(alpha));
  } else {
    out.mul_(beta).add_(product, alpha);
  }
}

}  // namespace loom::kernels::cpu
