// loom bench --profile: a Chrome trace (chrome://tracing, Perfetto) of the timed steps, with every
// ATen operator's time and Loom's own ranges ("step N", "forward", "backward", "optimizer"). A CUDA
// build records with Kineto (host operators, and on a GPU job the device kernels on their streams);
// the CPU build with libtorch's operator profiler.
#pragma once
#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace loom::train {

class Profile {
 public:
  // Starts recording (CheckpointError when `path` cannot be written).
  Profile(std::string path, const at::Device& device);
  // Stops recording and writes the trace, if finish() has not.
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;
  // Stops recording and writes the trace.
  void finish();

 private:
  struct Recording;
  std::string path_;
  std::unique_ptr<Recording> recording_;
};

}  // namespace loom::train
