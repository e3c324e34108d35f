// The process groups a job's model, task and plan are built over, from the job's parallel section
// and the world of processes: data parallelism (x context parallelism) sums gradients; data
// parallelism shares out the data, context parallelism each sample's tokens; tensor parallelism splits
// layers; pipeline parallelism cuts the layer list into stages (every rank of a pipeline reads the same
// data).
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

#include "loom/config/config.h"
#include "loom/dist/comm.h"
#include "loom/dist/parallel_state.h"

namespace loom::core {

struct Layout {
  std::shared_ptr<dist::Comm> world;            // null: one process
  std::shared_ptr<dist::ParallelState> groups;  // with world
  std::shared_ptr<dist::Comm> data;             // with world: dp x cp
  std::shared_ptr<dist::Comm> tp;               // with world and tp > 1
  std::shared_ptr<dist::Comm> pipeline;         // with world and pp > 1
  std::shared_ptr<dist::Comm> cp;               // with world and cp > 1
  int64_t data_parallel = 1;                    // dp
  int64_t context_parallel = 1;                 // cp
  at::Device device = at::kCPU;                 // training.device's (core/device.h)

  bool is_main() const { return !world || world->rank() == 0; }
  // This rank's place in `data` (dp x cp), for work dealt to every rank alike (evaluation).
  int64_t data_rank() const { return data ? data->rank() : 0; }
  // The training data's share this rank reads, of data_shards(degree), when each sample's tokens are
  // split over `degree` consecutive ranks of a cp group (0: all of them, the job's cp; dynamic context
  // parallelism picks a divisor of it per step): those ranks read the same samples.
  int64_t data_shard(int64_t degree = 0) const {
    return data_rank() / (degree > 0 ? degree : context_parallel);
  }
  int64_t data_shards(int64_t degree = 0) const {
    return data_parallel * context_parallel / (degree > 0 ? degree : context_parallel);
  }
  // Whether this rank counts what a step's data holds (samples, tokens, the loss's count) at that
  // degree: the first of the ranks that share its samples.
  bool counts_data(int64_t degree = 0) const {
    return !cp || cp->rank() % (degree > 0 ? degree : context_parallel) == 0;
  }
};

// Forms the job's groups over `world` (null: one process); ConfigError when the layout does not
// fit the world's size.
Layout make_layout(const config::JobConfig& job, std::shared_ptr<dist::Comm> world);

}  // namespace loom::core
