// Warp-wide 16 x 16 x 16 matrix products on the tensor cores (CUDA's wmma), bf16 or fp16 operands
// and fp32 accumulators, and their CPU emulation beside simt.h's.
//
// A fragment is a warp's 16 x 16 tile spread over its 32 lanes; which lane holds which element is
// unspecified (it differs between GPU generations), so kernels only load, multiply, store and fill
// fragments, or change each of an accumulator's elements alike (operand fragments differ even in
// their element count: 16 for fp16, 8 for bf16 on sm_80). The one thing a kernel may rely on is
// that fragments of one kind share their layout: loading a tile of row (or column) indices gives
// each element's row (or column), which lets a kernel scale an accumulator's rows or scatter its
// elements into shared memory itself. The emulator places elements by a scrambled permutation of
// its own, different for each kind, so code that assumed a layout fails its tests.
//
// Every lane of the warp must take part in each call, with the same pointer and stride. Pointers
// are 32-byte aligned; strides (in elements) are multiples of 8 for 16-bit operands and of 4 for
// fp32. The emulator checks these rules.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "loom/kernels/cuda/namespace.h"
#include "loom/kernels/cuda/simt.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#else
#include <cstdint>
#include <stdexcept>
#include <string>
#endif

namespace LOOM_CUDA_NAMESPACE::simt::mma {

constexpr int kTile = 16;

#if defined(__CUDACC__)

namespace wmma = nvcuda::wmma;

template <typename T>
struct Native;
template <>
struct Native<c10::BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct Native<c10::Half> {
  using type = __half;
};

// A of A B, row-major in memory.
template <typename T>
using MatrixA =
    wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, typename Native<T>::type, wmma::row_major>;
// B of A B, row-major in memory (B[k][n] at p[k * ld + n]).
template <typename T>
using MatrixB =
    wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, typename Native<T>::type, wmma::row_major>;
// B of A B read from its transpose stored row-major (B[k][n] at p[n * ld + k]): A M^T for a row-major M.
template <typename T>
using MatrixBT =
    wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, typename Native<T>::type, wmma::col_major>;
using Accumulator = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

template <typename T>
LOOM_DEVICE void load(MatrixA<T>& a, const T* p, unsigned ld) {
  wmma::load_matrix_sync(a, reinterpret_cast<const typename Native<T>::type*>(p), ld);
}
template <typename T>
LOOM_DEVICE void load(MatrixB<T>& b, const T* p, unsigned ld) {
  wmma::load_matrix_sync(b, reinterpret_cast<const typename Native<T>::type*>(p), ld);
}
template <typename T>
LOOM_DEVICE void load(MatrixBT<T>& b, const T* p, unsigned ld) {
  wmma::load_matrix_sync(b, reinterpret_cast<const typename Native<T>::type*>(p), ld);
}
LOOM_DEVICE void load(Accumulator& c, const float* p, unsigned ld) {
  wmma::load_matrix_sync(c, p, ld, wmma::mem_row_major);
}
LOOM_DEVICE void store(float* p, const Accumulator& c, unsigned ld) {
  wmma::store_matrix_sync(p, c, ld, wmma::mem_row_major);
}
LOOM_DEVICE void zero(Accumulator& c) { wmma::fill_fragment(c, 0.0F); }
// c += a b
template <typename A, typename B>
LOOM_DEVICE void multiply_add(Accumulator& c, const A& a, const B& b) {
  wmma::mma_sync(c, a, b, c);
}

#else

namespace detail {

enum class Kind { kA, kB, kBT, kAccumulator };

// Element i of a lane is at (position / 16, position % 16) of the tile: an odd multiplier makes
// this a permutation of the 256 positions, scrambled differently for each kind.
constexpr int position(Kind kind, int lane, int i) {
  constexpr int kMultiplier[] = {37, 61, 101, 149}, kOffset[] = {5, 11, 7, 3};
  const int k = static_cast<int>(kind);
  return ((i * kWarp + lane) * kMultiplier[k] + kOffset[k]) & 255;
}

inline int lane() { return thread_id() % kWarp; }

inline void check(const void* p, unsigned ld, unsigned ld_multiple, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    throw std::logic_error(std::string("simt mma: ") + what + " pointer not 32-byte aligned");
  if (ld % ld_multiple != 0)
    throw std::logic_error(std::string("simt mma: ") + what + " stride " + std::to_string(ld) +
                           " not a multiple of " + std::to_string(ld_multiple));
}

template <Kind kKind>
struct Fragment {
  static constexpr int num_elements = 8;
  float x[num_elements];
};

}  // namespace detail

template <typename T>
using MatrixA = detail::Fragment<detail::Kind::kA>;
template <typename T>
using MatrixB = detail::Fragment<detail::Kind::kB>;
template <typename T>
using MatrixBT = detail::Fragment<detail::Kind::kBT>;
using Accumulator = detail::Fragment<detail::Kind::kAccumulator>;

// Loads element (r, c) of the tile from p[r * row_step + c * col_step].
template <detail::Kind kKind, typename T>
void load_strided(detail::Fragment<kKind>& f, const T* p, unsigned row_step, unsigned col_step) {
  const int lane = detail::lane();
  for (int i = 0; i < f.num_elements; ++i) {
    const int at = detail::position(kKind, lane, i);
    f.x[i] = static_cast<float>(p[(at / kTile) * row_step + (at % kTile) * col_step]);
  }
}

template <typename T>
void load(detail::Fragment<detail::Kind::kA>& a, const T* p, unsigned ld) {
  detail::check(p, ld, 8, "matrix A");
  load_strided(a, p, ld, 1);
}
template <typename T>
void load(detail::Fragment<detail::Kind::kB>& b, const T* p, unsigned ld) {
  detail::check(p, ld, 8, "matrix B");
  load_strided(b, p, ld, 1);
}
template <typename T>
void load(detail::Fragment<detail::Kind::kBT>& b, const T* p, unsigned ld) {
  detail::check(p, ld, 8, "matrix B (column-major)");
  load_strided(b, p, 1, ld);  // B[k][n] at p[n * ld + k]
}
inline void load(Accumulator& c, const float* p, unsigned ld) {
  detail::check(p, ld, 4, "accumulator");
  load_strided(c, p, ld, 1);
}
inline void store(float* p, const Accumulator& c, unsigned ld) {
  detail::check(p, ld, 4, "accumulator");
  const int lane = detail::lane();
  for (int i = 0; i < c.num_elements; ++i) {
    const int at = detail::position(detail::Kind::kAccumulator, lane, i);
    p[(at / kTile) * ld + at % kTile] = c.x[i];
  }
}
inline void zero(Accumulator& c) {
  for (float& x : c.x) x = 0;
}
// c += a b: the warp's operands gathered, each lane computing its own elements in fp32.
template <detail::Kind kA, detail::Kind kB>
void multiply_add(Accumulator& c, const detail::Fragment<kA>& a, const detail::Fragment<kB>& b) {
  static_assert(kA == detail::Kind::kA && (kB == detail::Kind::kB || kB == detail::Kind::kBT),
                "multiply_add takes a MatrixA and a MatrixB or MatrixBT");
  constexpr int kCount = 8;
  float mine[2 * kCount], all[kWarp * 2 * kCount];
  for (int i = 0; i < kCount; ++i) {
    mine[i] = a.x[i];
    mine[kCount + i] = b.x[i];
  }
  emulator::warp_all_gather(mine, 2 * kCount, all);
  float ta[kTile * kTile], tb[kTile * kTile];
  for (int lane = 0; lane < kWarp; ++lane)
    for (int i = 0; i < kCount; ++i) {
      ta[detail::position(kA, lane, i)] = all[lane * 2 * kCount + i];
      tb[detail::position(kB, lane, i)] = all[lane * 2 * kCount + kCount + i];
    }
  const int lane = detail::lane();
  for (int i = 0; i < c.num_elements; ++i) {
    const int at = detail::position(detail::Kind::kAccumulator, lane, i), r = at / kTile, n = at % kTile;
    float sum = c.x[i];
    for (int k = 0; k < kTile; ++k) sum += ta[r * kTile + k] * tb[k * kTile + n];
    c.x[i] = sum;
  }
}

#endif

}  // namespace LOOM_CUDA_NAMESPACE::simt::mma
