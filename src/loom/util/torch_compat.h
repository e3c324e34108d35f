// The one place that hides differences between libtorch 1.13 (Debian) and 2.x (CUDA builds).
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Optional.h>

namespace loom {

#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
template <typename T>
using optional = std::optional<T>;
#else
template <typename T>
using optional = c10::optional<T>;
#endif

}  // namespace loom
