#!/usr/bin/env bash
# Compiles Loom's CUDA kernels (src/loom/kernels/cuda) for the GPU on a machine without one: the
# CPU build runs those kernels only under the SIMT emulator, which is plain C++, so this is the
# check that they are valid CUDA too.
#  - With nvcc (on PATH, $CUDACXX or /usr/local/cuda): every .cu file, host and device code, against
#    libtorch's headers (the include folders given as arguments, else /usr/include), for sm_90, and
#    prints each kernel's registers and spills as ptxas reports them. A CPU-only libtorch lacks one
#    generated CUDA header (c10/cuda/impl/cuda_cmake_macros.h); it is written here.
#  - Else with clang's CUDA front end (NVPTX target): the CUDA-core kernels' device code
#    (attention_kernels.cuh, delta_rule_kernels.cuh, pointwise_kernels.cuh) to PTX, the few CUDA declarations it uses from a
#    prelude written here, instantiated for fp32 and a 16-bit storage type as the host code
#    instantiates them for bf16 and fp16. The tensor-core kernels (attention_mma_kernels.cuh) need
#    CUDA's own mma.h, so only the nvcc path compiles them.
#   bash scripts/check-cuda-device-code.sh [--clang] [TORCH_INCLUDE_DIR ...]   (--clang: skip nvcc)
# Exit 0: compiled; 1: a compile error (printed); 77: neither compiler here.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
NVCC=${CUDACXX:-$(command -v nvcc || true)}
[ -n "$NVCC" ] || { [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc; }
[ "${1:-}" = --clang ] && NVCC= && shift
INCLUDES=("$@")
[ ${#INCLUDES[@]} -gt 0 ] || INCLUDES=(/usr/include)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -n "$NVCC" ]; then
  mkdir -p "$work/shim/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$work/shim/c10/cuda/impl/cuda_cmake_macros.h"
  # The flags CMake gives nvcc in a CUDA build (CMakeLists.txt, loom_kernels_cuda).
  flags=(-std=c++20 --expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
    -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ -arch=sm_90 -O3 -D_GLIBCXX_USE_CXX11_ABI=1
    -Xptxas -v -I src)
  for dir in "${INCLUDES[@]}"; do [ "$dir" = /usr/include ] || flags+=(-isystem "$dir"); done
  flags+=(-isystem "$work/shim")
  status=0
  for source in src/loom/kernels/cuda/pointwise.cu src/loom/kernels/cuda/attention.cu src/loom/kernels/cuda/delta_rule.cu; do
    name=$(basename "$source" .cu)
    "$NVCC" "${flags[@]}" -c "$source" -o "$work/$name.o" >"$work/$name.log" 2>&1 &
  done
  for job in $(jobs -p); do wait "$job" || status=1; done
  if [ "$status" -ne 0 ]; then
    grep -hE "error|warning" "$work"/*.log | head -40
    echo "check-cuda-device-code: nvcc failed"
    exit 1
  fi
  # ptxas: "Compiling entry function 'NAME'" then "... N bytes spill stores ..." and "Used R registers".
  cat "$work"/*.log | awk '
    /Compiling entry function/ {
      name = "?"
      if (match($0, /(flash_mma|flash|delta|cuda)[0-9]+[a-z_]+_kernel/)) {
        name = substr($0, RSTART, RLENGTH); sub(/^(cuda|flash|delta)[0-9]+/, "", name); sub(/[0-9]+/, "::", name)
      }
    }
    /spill stores/ { spills = $5 + $9 }
    /Used [0-9]+ registers/ { regs = $5; n[name]++; if (regs > top[name]) top[name] = regs; spill[name] += spills }
    END { for (k in n) printf "  %-26s %2d instances, up to %3d registers, %d bytes of spill stores and loads\n", k, n[k], top[k], spill[k] }' | sort
  echo "check-cuda-device-code: the .cu files compiled by $("$NVCC" --version | tail -1) for sm_90"
  exit 0
fi

CLANG=$(command -v clang++ || command -v clang++-14 || true)
[ -n "$CLANG" ] || { echo "check-cuda-device-code: neither nvcc nor clang++ here"; exit 77; }
"$CLANG" -print-targets 2>/dev/null | grep -q nvptx64 || { echo "check-cuda-device-code: no nvcc, and $CLANG has no NVPTX target"; exit 77; }
cat >"$work/prelude.h" <<'EOF'
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define __align__(n) __attribute__((aligned(n)))
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
#include <stdlib.h>
#include <__clang_cuda_builtin_vars.h>
__device__ inline float __shfl_xor_sync(unsigned mask, float v, int lane) {
  return __nvvm_shfl_sync_bfly_f32(mask, v, lane, 0x1f);
}
__device__ inline void __syncwarp(unsigned mask = 0xffffffffu) { __nvvm_bar_warp_sync(mask); }
extern "C" __device__ float expf(float);
extern "C" __device__ float logf(float);
extern "C" __device__ float rsqrtf(float);
extern "C" __device__ float fmaxf(float, float);
EOF
cat >"$work/instances.cu" <<'EOF'
#include "loom/kernels/cuda/attention_kernels.cuh"
#include "loom/kernels/cuda/delta_rule_kernels.cuh"
#include "loom/kernels/cuda/pointwise_kernels.cuh"

// 16-bit storage with fp32 conversions, as c10::BFloat16 and c10::Half are on the device.
struct Storage16 {
  unsigned short bits;
  Storage16() = default;
  __host__ __device__ Storage16(float f) : bits(static_cast<unsigned short>(__builtin_bit_cast(unsigned, f) >> 16)) {}
  __host__ __device__ operator float() const { return __builtin_bit_cast(float, static_cast<unsigned>(bits) << 16); }
};

namespace k = loom::kernels::cuda;

template <typename T, int kSlice>
void attention() {
  (void)&k::flash::attention_forward_kernel<T, kSlice>;
  (void)&k::flash::attention_dq_kernel<T, kSlice>;
  (void)&k::flash::attention_dkv_kernel<T, kSlice>;
}

template <typename T>
void all() {
  attention<T, 4>();
  attention<T, 8>();
  attention<T, 16>();
  attention<T, 32>();
  (void)&k::rms_norm_forward_kernel<T, T>;
  (void)&k::rms_norm_forward_kernel<T, float>;
  (void)&k::rms_norm_backward_kernel<T, T>;
  (void)&k::rms_norm_backward_kernel<T, float>;
  (void)&k::swiglu_forward_kernel<T>;
  (void)&k::swiglu_backward_kernel<T>;
  (void)&k::rotary_kernel<T, true>;
  (void)&k::rotary_kernel<T, false>;
}

void instances() {
  all<float>();
  all<Storage16>();
  (void)&k::delta::delta_rule_forward_kernel;
  (void)&k::delta::delta_rule_backward_kernel;
}
EOF
if ! "$CLANG" -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_80 -Xclang -target-feature -Xclang +ptx70 -std=c++17 -O2 \
  -Wno-unknown-cuda-version -D__CUDACC__ -include "$work/prelude.h" -I src -S -o "$work/kernels.ptx" \
  "$work/instances.cu" 2>"$work/errors.txt"; then
  cat "$work/errors.txt"
  exit 1
fi
kernels=$(grep -c "^\.visible \.entry\|^\.entry\|\.entry " "$work/kernels.ptx")
echo "check-cuda-device-code: $kernels kernel instances compiled to PTX for sm_80 by $("$CLANG" --version | head -1)"
[ "$kernels" -ge 34 ] || { echo "expected at least 34 kernel instances"; exit 1; }
