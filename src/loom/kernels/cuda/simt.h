// The few SIMT primitives Loom's CUDA kernels are written with, and a CPU emulator of them.
//
// Compiled by nvcc, each primitive is its CUDA builtin. Compiled by a plain C++ compiler (Loom's
// CPU builds), the same kernel source runs under an emulator, in the spirit of Triton's interpreter
// mode: every CUDA thread of a block is a fiber on the calling thread, switched only at barriers and
// warp shuffles, and blocks run one after another. So the CPU-only CI checks the kernels' indexing,
// masking, tiling and arithmetic against the composite references; only their speed (and the
// hardware's memory model) needs a GPU. Blocks are one-dimensional, a whole number of warps;
// grids have up to three dimensions. Warp-wide matrix products on the tensor cores: simt_mma.h.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

#include "loom/kernels/cuda/namespace.h"

#if defined(__CUDACC__)
#define LOOM_KERNEL __global__
#define LOOM_DEVICE __device__ __forceinline__
#define LOOM_SHARED __shared__
#define LOOM_UNROLL _Pragma("unroll")
#define LOOM_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#else
#define LOOM_KERNEL
#define LOOM_DEVICE inline
// Blocks are emulated one at a time (launches are serialised), so one static copy serves as the
// running block's shared memory.
#define LOOM_SHARED static
#define LOOM_UNROLL
#define LOOM_LAUNCH_BOUNDS(threads, blocks)
#endif

namespace LOOM_CUDA_NAMESPACE::simt {

constexpr int kWarp = 32;

struct Dim {
  unsigned x = 1, y = 1, z = 1;
};

#if defined(__CUDACC__)

LOOM_DEVICE int thread_id() { return static_cast<int>(threadIdx.x); }
LOOM_DEVICE int block_threads() { return static_cast<int>(blockDim.x); }
LOOM_DEVICE Dim block_index() { return {blockIdx.x, blockIdx.y, blockIdx.z}; }
LOOM_DEVICE Dim grid_size() { return {gridDim.x, gridDim.y, gridDim.z}; }
LOOM_DEVICE void sync_threads() { __syncthreads(); }
LOOM_DEVICE void sync_warp() { __syncwarp(); }
// The block's dynamic shared memory (its size is the launch's), 128-byte aligned.
LOOM_DEVICE unsigned char* dynamic_shared() {
  extern __shared__ __align__(128) unsigned char pool[];
  return pool;
}
LOOM_DEVICE float shuffle_xor(float value, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
}
// Copies 16 bytes, both pointers 16-byte aligned, in one vector load and store.
LOOM_DEVICE void copy16(void* to, const void* from) {
  *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
}
LOOM_DEVICE float exp(float x) { return ::expf(x); }
LOOM_DEVICE float rsqrt(float x) { return ::rsqrtf(x); }
LOOM_DEVICE float log(float x) { return ::logf(x); }

#else

namespace emulator {
struct Thread {
  int id = 0;
  int block_threads = 0;
  Dim block, grid;
};
// The fiber running now (launches are serialised, so one pointer serves the process).
extern const Thread* current;
void sync_threads();
void sync_warp();
unsigned char* dynamic_shared();
float shuffle_xor(float value, int lane_mask);
// Every lane of the calling warp gives `count` values; `all` gets the warp's, lane by lane (the
// matrix products of simt_mma.h). Throws std::logic_error when some of the warp's lanes returned.
void warp_all_gather(const float* mine, int count, float* all);
}  // namespace emulator

inline int thread_id() { return emulator::current->id; }
inline int block_threads() { return emulator::current->block_threads; }
inline Dim block_index() { return emulator::current->block; }
inline Dim grid_size() { return emulator::current->grid; }
inline void sync_threads() { emulator::sync_threads(); }
inline void sync_warp() { emulator::sync_warp(); }
inline unsigned char* dynamic_shared() { return emulator::dynamic_shared(); }
inline float shuffle_xor(float value, int lane_mask) { return emulator::shuffle_xor(value, lane_mask); }
inline void copy16(void* to, const void* from) { std::memcpy(to, from, 16); }
inline float exp(float x) { return std::exp(x); }
inline float rsqrt(float x) { return 1.0F / std::sqrt(x); }
inline float log(float x) { return std::log(x); }

// Runs `body` as every thread of every block of the grid; throws std::logic_error when a block's
// waiting threads can never all be released (some at the block barrier while their warp waits
// in a shuffle for them, or barriers that live threads never reach: a deadlock on a GPU too) or a
// block's size is not a whole number of warps. Barriers are counted, not told apart by call site.
// Each block gets `shared_bytes` of dynamic shared memory, filled with 0xff bytes (NaN as floats
// and as bf16 or fp16) so that a read of what the block never wrote shows.
void emulate(Dim grid, int block_threads, const std::function<void()>& body, size_t shared_bytes = 0);

#endif

// Sum over aligned groups of `kWidth` consecutive lanes (a power of two up to a warp): every lane
// of a group gets its group's sum.
template <int kWidth>
LOOM_DEVICE float group_sum(float value) {
  LOOM_UNROLL
  for (int mask = kWidth / 2; mask > 0; mask /= 2) value += shuffle_xor(value, mask);
  return value;
}

template <int kWidth>
LOOM_DEVICE float group_max(float value) {
  LOOM_UNROLL
  for (int mask = kWidth / 2; mask > 0; mask /= 2) value = fmaxf(value, shuffle_xor(value, mask));
  return value;
}

}  // namespace LOOM_CUDA_NAMESPACE::simt
