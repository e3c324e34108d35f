// Host side of the gated delta rule on CUDA (delta_rule_kernels.cuh): the segments' chunk table,
// the shared-memory and scratch sizes, and the launches.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "loom/kernels/cuda/delta_rule_kernels.cuh"
#include "loom/kernels/cuda/launch.h"
#include "loom/kernels/cuda/ops.h"

namespace LOOM_CUDA_NAMESPACE {
namespace {

using namespace delta;

// Blocks of the backward pass that run at once, each with its own scratch: a few per
// multiprocessor on a GPU. The emulator runs two, so its tests take the grid-stride loop too.
int64_t resident_blocks(size_t shared_bytes) {
#if defined(__CUDACC__)
  int device = 0, sms = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  return static_cast<int64_t>(sms) * std::max<int64_t>(1, static_cast<int64_t>(per_sm) / shared_bytes);
#else
  return 2;
#endif
}

// The kernels' view of the problem; `first_chunk` (device) must outlive the launches.
struct Table {
  Problem problem;
  at::Tensor cu, first_chunk;
  int64_t chunks = 0;
};

Table table_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
               const at::Tensor& beta, const DeltaRuleShape& shape) {
  if (shape.chunk < 1)
    throw ModelError("delta rule: chunk_size must be positive, got " + std::to_string(shape.chunk));
  std::vector<int64_t> first{0};
  for (size_t s = 0; s + 1 < shape.cu_seqlens.size(); ++s)
    first.push_back(first.back() +
                    (shape.cu_seqlens[s + 1] - shape.cu_seqlens[s] + shape.chunk - 1) / shape.chunk);
  Table t;
  t.cu = to_device(shape.cu_seqlens, at::kLong, q.device());
  t.first_chunk = to_device(first, at::kLong, q.device());
  t.chunks = first.back();
  t.problem = {q.data_ptr<float>(),
               k.data_ptr<float>(),
               v.data_ptr<float>(),
               g.data_ptr<float>(),
               beta.data_ptr<float>(),
               t.cu.data_ptr<int64_t>(),
               t.first_chunk.data_ptr<int64_t>(),
               q.size(1),
               v.size(1),
               q.size(2),
               v.size(2),
               shape.chunk,
               shape.scale};
  return t;
}

size_t bytes(int64_t floats) { return static_cast<size_t>(floats) * sizeof(float); }

}  // namespace

bool delta_rule_fits(int64_t dk, int64_t dv, at::Device device) {
  if (dk < 1 || dv < 1 || dv > kMaxThreads) return false;
#if defined(__CUDACC__)
  int limit = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                        device.has_index() ? device.index() : c10::cuda::current_device()));
  return bytes(backward_shared_floats(dk, dv)) <= static_cast<size_t>(limit);
#else
  return true;
#endif
}

DeltaRuleForward delta_rule_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, const at::Tensor& beta, const at::Tensor& state0,
                                    const DeltaRuleShape& shape) {
  const DeviceGuard guard(q.device());
  const Table t = table_of(q, k, v, g, beta, shape);
  const Problem& p = t.problem;
  const int64_t segments = static_cast<int64_t>(shape.cu_seqlens.size()) - 1;
  const auto f32 = q.options();
  DeltaRuleForward r{at::empty({q.size(0), p.hv, p.dv}, f32), at::empty({segments, p.hv, p.dk, p.dv}, f32),
                     at::empty({t.chunks, p.hv, p.dk, p.dv}, f32)};
  launch_shared(delta_rule_forward_kernel, {static_cast<unsigned>(segments * p.hv)}, threads_for(p.dv),
                bytes(forward_shared_floats(p.dk, p.dv)), p, state0.data_ptr<float>(),
                r.out.data_ptr<float>(), r.final_state.data_ptr<float>(), r.checkpoints.data_ptr<float>());
  return r;
}

DeltaRuleGrads delta_rule_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& g, const at::Tensor& beta, const at::Tensor& checkpoints,
                                   const at::Tensor& dout, const at::Tensor& dfinal,
                                   const DeltaRuleShape& shape) {
  const DeviceGuard guard(q.device());
  const Table t = table_of(q, k, v, g, beta, shape);
  const Problem& p = t.problem;
  const int64_t segments = static_cast<int64_t>(shape.cu_seqlens.size()) - 1, items = segments * p.hv;
  const auto f32 = q.options();
  // Per value head first; a key head's gradient is the sum over the value heads it serves.
  at::Tensor dq = at::empty({q.size(0), p.hv, p.dk}, f32), dk = at::empty({q.size(0), p.hv, p.dk}, f32);
  DeltaRuleGrads r{{},
                   {},
                   at::empty_like(v),
                   at::empty_like(g),
                   at::empty_like(beta),
                   at::empty({segments, p.hv, p.dk, p.dv}, f32)};
  // Recomputed spans of about sqrt(chunk) tokens: scratch of chunk/span + span states a block.
  const int64_t span = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(shape.chunk))));
  const size_t shared = bytes(backward_shared_floats(p.dk, p.dv));
  const int64_t blocks = std::max<int64_t>(1, std::min(items, resident_blocks(shared)));
  at::Tensor scratch = at::empty({blocks * backward_scratch_floats(p.dk, p.dv, p.chunk, span)}, f32);
  const Grads d{dout.defined() ? dout.data_ptr<float>() : nullptr,
                dfinal.defined() ? dfinal.data_ptr<float>() : nullptr,
                dq.data_ptr<float>(),
                dk.data_ptr<float>(),
                r.dv.data_ptr<float>(),
                r.dg.data_ptr<float>(),
                r.dbeta.data_ptr<float>(),
                r.dstate0.data_ptr<float>()};
  launch_shared(delta_rule_backward_kernel, {static_cast<unsigned>(blocks)}, threads_for(p.dv), shared, p, d,
                checkpoints.data_ptr<float>(), items, span, scratch.data_ptr<float>());
  const int64_t repeat = p.hv / p.hk;
  r.dq = dq.view({q.size(0), p.hk, repeat, p.dk}).sum(2);
  r.dk = dk.view({q.size(0), p.hk, repeat, p.dk}).sum(2);
  return r;
}

}  // namespace LOOM_CUDA_NAMESPACE
