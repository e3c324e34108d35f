#include "loom/train/profile.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <set>
#include <utility>

#ifdef LOOM_TORCH_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>
#else
#include <torch/csrc/autograd/profiler_legacy.h>
#endif

#include "loom/util/errors.h"

namespace loom::train {

// A CUDA build: Kineto's session (the PyTorch builds with CUDA carry it), the GPU's activity too on a
// GPU job. A CPU build (Debian's libtorch has no Kineto): the operator profiler that writes its
// events as a Chrome trace when it ends.
struct Profile::Recording {
#ifdef LOOM_TORCH_CUDA
  bool kineto = false;
#else
  std::unique_ptr<torch::autograd::profiler::RecordProfile> cpu;
#endif
};

Profile::Profile(std::string path, const at::Device& device)
    : path_(std::move(path)), recording_(std::make_unique<Recording>()) {
  if (!std::ofstream(path_)) throw CheckpointError(fmt::format("--profile: cannot write {}", path_));
#ifdef LOOM_TORCH_CUDA
  namespace impl = torch::profiler::impl;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true,
                                    /*profile_memory=*/false);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(impl::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  recording_->kineto = true;
#else
  (void)device;
  recording_->cpu = std::make_unique<torch::autograd::profiler::RecordProfile>(path_);
#endif
}

Profile::~Profile() {
  try {
    finish();
  } catch (const std::exception& e) {
    spdlog::error("--profile: {}", e.what());
  }
}

void Profile::finish() {
  if (!recording_) return;
  std::unique_ptr<Recording> recording = std::move(recording_);
#ifdef LOOM_TORCH_CUDA
  if (recording->kineto) torch::autograd::profiler::disableProfiler()->save(path_);
#else
  recording->cpu.reset();  // writes the trace
#endif
  spdlog::info("wrote the profile of the timed steps to {} (chrome://tracing or ui.perfetto.dev)", path_);
}

}  // namespace loom::train
