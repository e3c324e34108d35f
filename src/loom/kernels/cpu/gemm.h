// Row-major single-precision matrix products for the CPU kernels' tiles: C = alpha op(A) op(B) +
// beta C, straight into the BLAS libtorch carries (MKL in the torch wheel) through BLAS's sgemm_,
// so a tile product costs no dispatcher round trip; through at::mm where no BLAS exports it.
#pragma once
#include <cstdint>

namespace loom::kernels::cpu {

// op(A) is m x k, op(B) is k x n, C is m x n; lda/ldb/ldc are the row strides of A, B, C as stored.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// For its lifetime, BLAS calls run on the calling thread only: the kernels call gemm on small tiles
// from every thread of their own parallel loop, where a BLAS thread pool would only contend with them
// (with OpenBLAS's, a causal attention at seq 4096 took 15x longer on 2 cores). Restores the previous
// count.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_ = 0;
  void (*restore_)(int) = nullptr;
};

}  // namespace loom::kernels::cpu
