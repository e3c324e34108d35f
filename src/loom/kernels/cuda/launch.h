// Host side of the kernels: launching on the current CUDA stream (or the emulator), and choosing
// the kernel instance for a tensor's dtype. Included by the .cu files only.
#pragma once
#include <ATen/ATen.h>

#include <cstddef>
#include <string>
#include <vector>

#include "loom/kernels/cuda/namespace.h"
#include "loom/kernels/cuda/simt.h"
#include "loom/util/errors.h"

#if defined(__CUDACC__)
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace LOOM_CUDA_NAMESPACE {

// Makes the tensors' GPU the current device, whose stream the launches use.
#if defined(__CUDACC__)
using DeviceGuard = c10::cuda::CUDAGuard;
#else
struct DeviceGuard {
  explicit DeviceGuard(at::Device) {}
};
#endif

// A host vector as a tensor on `device`: on a GPU through pinned memory, without blocking the host.
template <typename T>
at::Tensor to_device(const std::vector<T>& values, at::ScalarType type, at::Device device) {
  at::Tensor host = at::tensor(values, type);
#if defined(__CUDACC__)
  return host.pin_memory().to(device, /*non_blocking=*/true);
#else
  return host.to(device);
#endif
}

// Launches `kernel` with `shared_bytes` of dynamic shared memory (simt::dynamic_shared) a block.
template <typename... Params, typename... Args>
void launch_shared(void (*kernel)(Params...), simt::Dim grid, int threads, size_t shared_bytes,
                   Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
#if defined(__CUDACC__)
  // Beyond 48 KiB a block, a kernel must opt in (up to its GPU's limit; the launch check reports more).
  if (shared_bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  kernel<<<dim3(grid.x, grid.y, grid.z), threads, shared_bytes, c10::cuda::getCurrentCUDAStream()>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
#else
  simt::emulate(
      grid, threads, [&] { kernel(args...); }, shared_bytes);
#endif
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), simt::Dim grid, int threads, Args... args) {
  launch_shared(kernel, grid, threads, 0, args...);
}

// Calls f(T{}) with T the C++ type of a 16-bit floating dtype (bf16, fp16).
template <typename F>
void dispatch_16bit(at::ScalarType type, const char* op, F&& f) {
  if (type == at::kBFloat16)
    f(at::BFloat16{});
  else if (type == at::kHalf)
    f(at::Half{});
  else
    throw ModelError(std::string(op) + ": this CUDA kernel takes bf16 or fp16 tensors, not " +
                     c10::toString(type));
}

// Calls f(T{}) with T the C++ type of a floating dtype the kernels take (fp32, bf16, fp16).
template <typename F>
void dispatch_floating(at::ScalarType type, const char* op, F&& f) {
  switch (type) {
    case at::kFloat:
      f(float{});
      break;
    case at::kBFloat16:
      f(at::BFloat16{});
      break;
    case at::kHalf:
      f(at::Half{});
      break;
    default:
      throw ModelError(std::string(op) + ": the CUDA kernels take fp32, bf16 or fp16 tensors, not " +
                       c10::toString(type));
  }
}

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace LOOM_CUDA_NAMESPACE
