// The one place that hides differences between libtorch 1.13 (Debian) and 2.x (CUDA builds).
#pragma once
#include <ATen/ATen.h>

#include <optional>

// TORCH_VERSION_MAJOR lives in <torch/version.h> (torch/csrc/api/include, on Torch's include path in
// both versions); ATen/ATen.h does not define it, so include it before testing it.
#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
#define LOOM_TORCH_2 1
#else
#define LOOM_TORCH_2 0
#include <c10/util/Optional.h>
#endif

namespace loom {

#if LOOM_TORCH_2
// 2.x APIs take std::optional (c10::optional is an alias of it since 2.4).
template <typename T>
using optional = std::optional<T>;
#else
template <typename T>
using optional = c10::optional<T>;
#endif

}  // namespace loom
