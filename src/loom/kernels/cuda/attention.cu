// Host side of flash attention on CUDA: the tile table, the choice of kernels (the tensor-core ones of
// attention_mma_kernels.cuh for bf16 and fp16 up to head dimension 128 on sm_80 or later, else the
// fp32 CUDA-core ones of attention_kernels.cuh) and of their instance, and the launches.
#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/kernels/cuda/attention_kernels.cuh"
#include "loom/kernels/cuda/attention_mma_kernels.cuh"
#include "loom/kernels/cuda/launch.h"
#include "loom/kernels/cuda/ops.h"

namespace LOOM_CUDA_NAMESPACE {
namespace {

using namespace flash;

// Tiles of `rows` rows over every segment, as a device tensor of Tile.
at::Tensor tiles_of(const std::vector<int64_t>& cu, int rows, at::Device device) {
  std::vector<int32_t> flat;
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int64_t row = 0; row < cu[s + 1] - cu[s]; row += rows) {
      flat.push_back(static_cast<int32_t>(cu[s]));
      flat.push_back(static_cast<int32_t>(cu[s + 1] - cu[s]));
      flat.push_back(static_cast<int32_t>(row));
    }
  static_assert(sizeof(Tile) == 3 * sizeof(int32_t), "Tile is three int32");
  return to_device(flat, at::kInt, device);
}

const Tile* tile_data(const at::Tensor& tiles) {
  return reinterpret_cast<const Tile*>(tiles.data_ptr<int32_t>());
}

Geometry geometry_of(const at::Tensor& q, const at::Tensor& k, const AttentionShape& shape) {
  if (q.size(2) > 256)
    throw ModelError("flash_attention: the CUDA kernel takes head_dim up to 256, got " +
                     std::to_string(q.size(2)));
  if (q.size(1) > 65535)
    throw ModelError("flash_attention: the CUDA kernel takes up to 65535 query heads, got " +
                     std::to_string(q.size(1)));
  if (q.size(0) > std::numeric_limits<int32_t>::max())
    throw ModelError("flash_attention: the CUDA kernel takes up to 2^31 - 1 tokens, got " +
                     std::to_string(q.size(0)));
  return {q.size(1), k.size(1), q.size(2), shape.scale, shape.causal, shape.window};
}

// Calls f(std::integral_constant<int, kSlice>) for the head dimension's slice per lane.
template <typename F>
void dispatch_slice(int64_t dim, F&& f) {
  if (dim <= 4 * kGroup)
    f(std::integral_constant<int, 4>{});
  else if (dim <= 8 * kGroup)
    f(std::integral_constant<int, 8>{});
  else if (dim <= 16 * kGroup)
    f(std::integral_constant<int, 16>{});
  else
    f(std::integral_constant<int, 32>{});
}

// Whether the tensor-core kernels take q: bf16 or fp16, head dimension up to 128, and (on a GPU)
// code built for sm_80 or later in the image the current GPU runs. That also rules out older GPUs,
// and newer ones that JIT-compile an older architecture's PTX, for which the kernels are empty.
bool tensor_cores_take(const at::Tensor& q) {
  if ((q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf) || q.size(2) > 128) return false;
#if defined(__CUDACC__)
  cudaFuncAttributes built{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&built, flash_mma::forward_kernel<at::BFloat16, 64>));
  return built.ptxVersion >= 80;
#else
  return true;
#endif
}

// Calls f(std::integral_constant<int, kDim>) for the tensor-core kernels' padded head dimension.
template <typename F>
void dispatch_padded_dim(int64_t dim, F&& f) {
  if (dim <= 64)
    f(std::integral_constant<int, 64>{});
  else if (dim <= 80)
    f(std::integral_constant<int, 80>{});
  else
    f(std::integral_constant<int, 128>{});
}

}  // namespace

std::pair<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const AttentionShape& shape) {
  const DeviceGuard guard(q.device());
  const Geometry geo = geometry_of(q, k, shape);
  const int64_t tokens = q.size(0);
  at::Tensor out = at::empty_like(q);
  at::Tensor lse = at::empty({geo.heads, tokens}, q.options().dtype(at::kFloat));
  if (tensor_cores_take(q)) {
    const at::Tensor tiles = tiles_of(shape.cu_seqlens, flash_mma::kRows, q.device());
    const simt::Dim grid{static_cast<unsigned>(tiles.size(0) / 3), static_cast<unsigned>(geo.heads)};
    dispatch_16bit(q.scalar_type(), "flash_attention", [&](auto tag) {
      using T = decltype(tag);
      dispatch_padded_dim(geo.dim, [&](auto dim) {
        constexpr int kDim = decltype(dim)::value;
        launch_shared(flash_mma::forward_kernel<T, kDim>, grid, flash_mma::kThreads,
                      flash_mma::ForwardLayout<T, kDim>().bytes, q.data_ptr<T>(), k.data_ptr<T>(),
                      v.data_ptr<T>(), out.data_ptr<T>(), lse.data_ptr<float>(), tile_data(tiles), tokens,
                      geo);
      });
    });
    return {out, lse};
  }
  const at::Tensor tiles = tiles_of(shape.cu_seqlens, kRows, q.device());
  const simt::Dim grid{static_cast<unsigned>(tiles.size(0) / 3), static_cast<unsigned>(geo.heads)};
  dispatch_floating(q.scalar_type(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    dispatch_slice(geo.dim, [&](auto slice) {
      launch(attention_forward_kernel<T, decltype(slice)::value>, grid, kThreads, q.data_ptr<T>(),
             k.data_ptr<T>(), v.data_ptr<T>(), out.data_ptr<T>(), lse.data_ptr<float>(), tile_data(tiles),
             tokens, geo);
    });
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                                                  const at::Tensor& k, const at::Tensor& v,
                                                                  const at::Tensor& out,
                                                                  const at::Tensor& lse,
                                                                  const AttentionShape& shape) {
  const DeviceGuard guard(q.device());
  const Geometry geo = geometry_of(q, k, shape);
  const int64_t tokens = q.size(0);
  const at::Tensor grad = dout.to(q.scalar_type()).contiguous();
  // delta_i = dout_i . out_i per query and head, (Hq, T) fp32.
  const at::Tensor delta = (grad.to(at::kFloat) * out.to(at::kFloat)).sum(-1).transpose(0, 1).contiguous();
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  if (tensor_cores_take(q)) {
    const at::Tensor tiles = tiles_of(shape.cu_seqlens, flash_mma::kRows, q.device());
    const unsigned tile_count = static_cast<unsigned>(tiles.size(0) / 3);
    dispatch_16bit(q.scalar_type(), "flash_attention", [&](auto tag) {
      using T = decltype(tag);
      dispatch_padded_dim(geo.dim, [&](auto dim) {
        constexpr int kDim = decltype(dim)::value;
        launch_shared(flash_mma::dq_kernel<T, kDim>, {tile_count, static_cast<unsigned>(geo.heads)},
                      flash_mma::kThreads, flash_mma::DqLayout<T, kDim>().bytes, q.data_ptr<T>(),
                      k.data_ptr<T>(), v.data_ptr<T>(), grad.data_ptr<T>(), lse.data_ptr<float>(),
                      delta.data_ptr<float>(), dq.data_ptr<T>(), tile_data(tiles), tokens, geo);
        launch_shared(flash_mma::dkv_kernel<T, kDim>, {tile_count, static_cast<unsigned>(geo.kv_heads)},
                      flash_mma::kThreads, flash_mma::DkvLayout<T, kDim>().bytes, q.data_ptr<T>(),
                      k.data_ptr<T>(), v.data_ptr<T>(), grad.data_ptr<T>(), lse.data_ptr<float>(),
                      delta.data_ptr<float>(), dk.data_ptr<T>(), dv.data_ptr<T>(), tile_data(tiles), tokens,
                      geo);
      });
    });
    return {dq, dk, dv};
  }
  const at::Tensor tiles = tiles_of(shape.cu_seqlens, kRows, q.device());
  const unsigned tile_count = static_cast<unsigned>(tiles.size(0) / 3);
  dispatch_floating(q.scalar_type(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    dispatch_slice(geo.dim, [&](auto slice) {
      constexpr int kSlice = decltype(slice)::value;
      launch(attention_dq_kernel<T, kSlice>, {tile_count, static_cast<unsigned>(geo.heads)}, kThreads,
             q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), grad.data_ptr<T>(), lse.data_ptr<float>(),
             delta.data_ptr<float>(), dq.data_ptr<T>(), tile_data(tiles), tokens, geo);
      launch(attention_dkv_kernel<T, kSlice>, {tile_count, static_cast<unsigned>(geo.kv_heads)}, kThreads,
             q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), grad.data_ptr<T>(), lse.data_ptr<float>(),
             delta.data_ptr<float>(), dk.data_ptr<T>(), dv.data_ptr<T>(), tile_data(tiles), tokens, geo);
    });
  });
  return {dq, dk, dv};
}

}  // namespace LOOM_CUDA_NAMESPACE
