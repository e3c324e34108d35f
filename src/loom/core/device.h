// The device a job trains on (training.device): the CPU, or, in a build against a CUDA libtorch, the
// GPU of this process's local rank. Model, batches, optimizer state and every task's helper models
// live there; checkpoints are read and written through the CPU either way, so CPU and GPU runs share
// their files.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "loom/config/config.h"
#include "loom/core/task.h"

namespace loom::core {

// Whether this build can run CUDA jobs (its libtorch has CUDA).
bool cuda_built();

// Makes the job's device current for this process, the `local_rank`-th GPU for a CUDA job (one
// process per GPU, as loom run, torchrun and Slurm start them), and sets TF32 as
// training.allow_tf32 says. ConfigError when the job asks for CUDA and this build, the machine or its
// GPUs cannot give this rank one.
at::Device select_device(const config::TrainingSection& training, int64_t local_rank);

// The job's device once select_device has run in this process (the current GPU for a CUDA job).
at::Device job_device(const config::TrainingSection& training);

// "NVIDIA H200", or "cpu".
std::string device_name(const at::Device& device);

// Waits for the work queued on `device` (nothing to wait for on the CPU), so host clocks time it.
void synchronize(const at::Device& device);

// A GPU's memory as its caching allocator counts it, in bytes: the most the tensors held (allocated)
// and the most it held from CUDA (reserved), since the last reset_peak_memory; zeros on the CPU.
struct DeviceMemory {
  int64_t peak_allocated = 0, peak_reserved = 0;
};
DeviceMemory device_memory(const at::Device& device);
void reset_peak_memory(const at::Device& device);

// Moves `step`'s host inputs (MicroBatch::device_inputs) into pinned (page-locked) memory, from which
// a GPU copies them while the host goes on. Called by the loader's threads for a GPU job.
void pin_inputs(StepData& step);

// Sends steps' inputs to the device one step ahead: start() queues the copies of a step's device
// inputs (on a stream of their own on a GPU, overlapping the step before's compute) and replaces
// each by its copy; ready() makes the compute stream wait for them before that step runs. Nothing
// happens on the CPU.
class InputStager {
 public:
  explicit InputStager(const at::Device& device);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;

  void start(StepData& step);
  void ready();

 private:
  struct Streams;  // the copy stream and its event, on a GPU
  at::Device device_;
  std::unique_ptr<Streams> streams_;
};

}  // namespace loom::core
