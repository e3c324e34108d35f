#include "loom/kernels/cpu/gemm.h"

#include <ATen/ATen.h>
#include <dlfcn.h>

namespace loom::kernels::cpu {

namespace {

// BLAS's Fortran interface, which every BLAS exports (the wheel's libtorch_cpu exports MKL's):
// column-major, 32-bit sizes, 'N' or 'T'.
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*, const int*);

Sgemm find_sgemm() {
  static const Sgemm fn = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return fn;
}

// The calling thread's BLAS thread count: MKL's per-thread setting (0: the global one), else
// OpenBLAS's global count.
using SetLocalThreads = int (*)(int);
using GetThreads = int (*)();
using SetThreads = void (*)(int);

}  // namespace

SingleThreadedBlas::SingleThreadedBlas() {
  // MKL's C entry point (mkl_service.h maps mkl_set_num_threads_local to it; the lower-case symbol
  // is the Fortran one, which takes a pointer).
  static const auto mkl_local =
      reinterpret_cast<SetLocalThreads>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
  static const auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  static const auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (mkl_local) {
    previous_ = mkl_local(1);
    restore_ = [](int previous) { mkl_local(previous); };
  } else if (get && set && (previous_ = get()) > 1) {
    set(1);
    restore_ = [](int previous) { set(previous); };
  }
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (restore_) restore_(previous_);
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (const Sgemm sgemm = find_sgemm()) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a row-major matrix as
    // stored is its column-major transpose.
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    const int ldai = static_cast<int>(lda), ldbi = static_cast<int>(ldb), ldci = static_cast<int>(ldc);
    const char ta = transpose_a ? 'T' : 'N', tb = transpose_b ? 'T' : 'N';
    sgemm(&tb, &ta, &ni, &mi, &ki, &alpha, b, &ldbi, a, &ldai, &beta, c, &ldci);
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
