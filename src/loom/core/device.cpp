#include "loom/core/device.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#ifdef LOOM_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "loom/util/errors.h"

namespace loom::core {

bool cuda_built() {
#ifdef LOOM_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

at::Device select_device(const config::TrainingSection& training, int64_t local_rank) {
  // fp32 products in full fp32 unless the job allows TF32 (cuDNN's convolutions default to it).
  at::globalContext().setAllowTF32CuBLAS(training.allow_tf32);
  at::globalContext().setAllowTF32CuDNN(training.allow_tf32);
  if (training.device != "cuda") return at::kCPU;
#ifdef LOOM_TORCH_CUDA
  const int64_t gpus = c10::cuda::device_count();
  if (gpus == 0)
    throw ConfigError(
        "training.device: cuda, but this machine shows no CUDA GPU (driver, "
        "CUDA_VISIBLE_DEVICES?)");
  if (local_rank >= gpus)
    throw ConfigError(fmt::format(
        "training.device: cuda: local rank {} has no GPU of its own ({} visible); start at most {} "
        "processes per machine",
        local_rank, gpus, gpus));
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
  return {at::kCUDA, static_cast<c10::DeviceIndex>(local_rank)};
#else
  (void)local_rank;
  throw ConfigError("training.device: cuda needs Loom built against a CUDA libtorch; this build is CPU-only");
#endif
}

at::Device job_device(const config::TrainingSection& training) {
  if (training.device != "cuda") return at::kCPU;
#ifdef LOOM_TORCH_CUDA
  return {at::kCUDA, c10::cuda::current_device()};
#else
  throw ConfigError("training.device: cuda needs Loom built against a CUDA libtorch; this build is CPU-only");
#endif
}

std::string device_name(const at::Device& device) {
#ifdef LOOM_TORCH_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return device.str();
}

void synchronize(const at::Device& device) {
#ifdef LOOM_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

DeviceMemory device_memory(const at::Device& device) {
  DeviceMemory out;
#ifdef LOOM_TORCH_CUDA
  if (device.is_cuda()) {
    // Entry 0 of each statistic is the aggregate over the allocator's pools.
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    out.peak_allocated = stats.allocated_bytes[0].peak;
    out.peak_reserved = stats.reserved_bytes[0].peak;
  }
#endif
  (void)device;
  return out;
}

void reset_peak_memory(const at::Device& device) {
#ifdef LOOM_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  (void)device;
}

void pin_inputs(StepData& step) {
  for (const auto& micro : step.micro_batches)
    for (at::Tensor* t : micro->device_inputs())
      if (t->defined() && t->is_cpu() && !t->is_pinned()) *t = t->pin_memory();
}

#ifdef LOOM_TORCH_CUDA
struct InputStager::Streams {
  explicit Streams(c10::DeviceIndex index) : copy(c10::cuda::getStreamFromPool(false, index)) {}
  c10::cuda::CUDAStream copy;
  at::cuda::CUDAEvent copied;
};
#else
struct InputStager::Streams {};
#endif

InputStager::InputStager(const at::Device& device) : device_(device) {
#ifdef LOOM_TORCH_CUDA
  if (device.is_cuda()) streams_ = std::make_unique<Streams>(device.index());
#endif
}

InputStager::~InputStager() = default;

void InputStager::start(StepData& step) {
  if (!streams_) return;
#ifdef LOOM_TORCH_CUDA
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  {
    const c10::cuda::CUDAStreamGuard on_copy(streams_->copy);
    for (const auto& micro : step.micro_batches)
      for (at::Tensor* t : micro->device_inputs()) {
        if (!t->defined() || !t->is_cpu()) continue;
        at::Tensor copy = t->to(device_, /*non_blocking=*/true);
        // Made on the copy stream, read on the compute stream: its memory is not reused before that.
        copy.record_stream(compute);
        *t = std::move(copy);
      }
  }
  streams_->copied.record(streams_->copy);
#else
  (void)step;
#endif
}

void InputStager::ready() {
  if (!streams_) return;
#ifdef LOOM_TORCH_CUDA
  streams_->copied.block(c10::cuda::getCurrentCUDAStream(device_.index()));
#endif
}

}  // namespace loom::core
