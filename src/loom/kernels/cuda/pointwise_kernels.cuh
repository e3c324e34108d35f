// Device code of the row-wise kernels (RMSNorm, SwiGLU, rotary embedding), forward and backward:
// only simt.h primitives, no ATen, so it also compiles for the CPU emulator and in the device-code
// check (scripts/check-cuda-device-code.sh). Each reads and writes every element once per pass, in
// fp32 registers whatever the storage dtype. Host wrappers: pointwise.cu.
#pragma once
#include "loom/kernels/cuda/namespace.h"
#include <cstdint>

#include "loom/kernels/cuda/simt.h"

namespace LOOM_CUDA_NAMESPACE {

using simt::kWarp;

// ---- RMSNorm: one block of kNormThreads per row ----

constexpr int kNormThreads = 128;
// Blocks of the backward pass, each summing its rows' share of d weight into its own row of a
// (kNormBlocks, D) buffer: a fixed count, so the sum (and the result) is the same on every GPU.
constexpr int kNormBlocks = 512;

// Sum over the block, in the same order on every thread; `scratch` holds kNormThreads / 32 floats.
LOOM_DEVICE float block_sum(float value, float* scratch) {
  value = simt::group_sum<kWarp>(value);
  const int tid = simt::thread_id();
  if (tid % kWarp == 0) scratch[tid / kWarp] = value;
  simt::sync_threads();
  float total = 0;
  for (int w = 0; w < kNormThreads / kWarp; ++w) total += scratch[w];
  simt::sync_threads();  // scratch is free again
  return total;
}

// x (rows, d) -> y (rows, d) = w * round_T(x * r), rstd (rows) = r.
template <typename T, typename Out>
LOOM_KERNEL void rms_norm_forward_kernel(const T* x, const float* w, Out* y, float* rstd, int64_t d,
                                         float eps) {
  LOOM_SHARED float scratch[kNormThreads / kWarp];
  const int64_t row = simt::block_index().x;
  const int tid = simt::thread_id();
  const T* xr = x + row * d;
  float squares = 0;
  for (int64_t i = tid; i < d; i += kNormThreads) {
    const float v = static_cast<float>(xr[i]);
    squares += v * v;
  }
  const float r = simt::rsqrt(block_sum(squares, scratch) / static_cast<float>(d) + eps);
  for (int64_t i = tid; i < d; i += kNormThreads)
    y[row * d + i] =
        static_cast<Out>(w[i] * static_cast<float>(static_cast<T>(static_cast<float>(xr[i]) * r)));
  if (tid == 0) rstd[row] = r;
}

// dx = r (dy w) - r^3 mean(dy w x) x; partial_dw[block] += dy x r over the block's rows.
template <typename T, typename G>
LOOM_KERNEL void rms_norm_backward_kernel(const G* dy, const T* x, const float* w, const float* rstd, T* dx,
                                          float* partial_dw, int64_t rows, int64_t d) {
  LOOM_SHARED float scratch[kNormThreads / kWarp];
  const int tid = simt::thread_id();
  const int64_t block = simt::block_index().x, blocks = simt::grid_size().x;
  float* dw = partial_dw + block * d;
  for (int64_t row = block; row < rows; row += blocks) {
    const T* xr = x + row * d;
    const G* gr = dy + row * d;
    const float r = rstd[row];
    float dot = 0;
    for (int64_t i = tid; i < d; i += kNormThreads)
      dot += static_cast<float>(gr[i]) * w[i] * static_cast<float>(xr[i]);
    const float c = r * r * r * block_sum(dot, scratch) / static_cast<float>(d);
    for (int64_t i = tid; i < d; i += kNormThreads) {
      const float g = static_cast<float>(gr[i]), xv = static_cast<float>(xr[i]);
      dx[row * d + i] = static_cast<T>(r * g * w[i] - c * xv);
      dw[i] += g * xv * r;
    }
  }
}

// ---- SwiGLU: one thread per element ----

constexpr int kElementThreads = 256;

LOOM_DEVICE float sigmoid(float g) { return 1.0F / (1.0F + simt::exp(-g)); }

template <typename T>
LOOM_KERNEL void swiglu_forward_kernel(const T* gate, const T* up, T* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(simt::block_index().x) * kElementThreads + simt::thread_id();
  if (i >= n) return;
  const float g = static_cast<float>(gate[i]);
  y[i] = static_cast<T>(g * sigmoid(g) * static_cast<float>(up[i]));
}

// d gate = dy u s (1 + g (1 - s)), d up = dy g s, s = sigmoid(g).
template <typename T>
LOOM_KERNEL void swiglu_backward_kernel(const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                                        int64_t n) {
  const int64_t i = static_cast<int64_t>(simt::block_index().x) * kElementThreads + simt::thread_id();
  if (i >= n) return;
  const float g = static_cast<float>(gate[i]), u = static_cast<float>(up[i]), dyv = static_cast<float>(dy[i]);
  const float s = sigmoid(g);
  dup[i] = static_cast<T>(dyv * g * s);
  dgate[i] = static_cast<T>(dyv * u * s * (1.0F + g * (1.0F - s)));
}

// ---- Rotary embedding: one thread per rotated pair (position, head, i < D/2) ----

// Forward (sign 1): y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2. Backward, the transpose:
// dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1.
template <typename T, bool kBackward>
LOOM_KERNEL void rotary_kernel(const T* x, const float* cos, const float* sin, T* y, int64_t positions,
                               int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  const int64_t pair = static_cast<int64_t>(simt::block_index().x) * kElementThreads + simt::thread_id();
  if (pair >= positions * heads * half) return;
  const int64_t i = pair % half, row = pair / half, position = row / heads;
  const float* c = cos + position * d;
  const float* s = sin + position * d;
  const float a = static_cast<float>(x[row * d + i]), b = static_cast<float>(x[row * d + i + half]);
  if (kBackward) {
    y[row * d + i] = static_cast<T>(a * c[i] + b * s[i + half]);
    y[row * d + i + half] = static_cast<T>(b * c[i + half] - a * s[i]);
  } else {
    y[row * d + i] = static_cast<T>(a * c[i] - b * s[i]);
    y[row * d + i + half] = static_cast<T>(b * c[i + half] + a * s[i + half]);
  }
}

}  // namespace LOOM_CUDA_NAMESPACE
