// The namespace of Loom's CUDA kernels. A CUDA build compiles them twice: by nvcc for the GPU, and
// as C++ for the SIMT emulator (LOOM_SIMT_EMULATION), which its kernel tests run on the CPU. The
// emulated copy lives in an inline namespace of its own, so the two never share a symbol.
#pragma once

#if defined(LOOM_SIMT_EMULATION)
#define LOOM_CUDA_NAMESPACE loom::kernels::cuda::inline simt_emulation
#else
#define LOOM_CUDA_NAMESPACE loom::kernels::cuda
#endif
