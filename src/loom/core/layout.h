// Where a job runs: its parallel state (dist/parallel_state.h, the one object holding the rank grid
// and every process group) and its device, with what the data's sharing out asks of them: data
// parallelism (x context parallelism) sums gradients; data parallelism shares out the data, context
// parallelism each sample's tokens; tensor parallelism splits layers; pipeline parallelism cuts the
// layer list into stages (every rank of a pipeline reads the same data).
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

#include "loom/config/config.h"
#include "loom/dist/comm.h"
#include "loom/dist/parallel_state.h"

namespace loom::core {

struct Layout {
  std::shared_ptr<const dist::ParallelState> parallel = std::make_shared<dist::ParallelState>();
  at::Device device = at::kCPU;  // training.device's (core/device.h)

  // The parallel state's groups, as most readers want them.
  const std::shared_ptr<dist::Comm>& world() const { return parallel->world(); }  // null: one process
  const std::shared_ptr<dist::Comm>& data() const { return parallel->data(); }    // dp x cp
  const std::shared_ptr<dist::Comm>& tp() const { return parallel->tp(); }        // null: tp 1
  const std::shared_ptr<dist::Comm>& pipeline() const { return parallel->pp(); }  // null: pp 1
  const std::shared_ptr<dist::Comm>& cp() const { return parallel->cp(); }        // null: cp 1
  int64_t data_parallel() const { return parallel->sizes().dp; }
  int64_t context_parallel() const { return parallel->sizes().cp; }

  bool is_main() const { return parallel->is_main(); }
  // This rank's place in `data` (dp x cp), for work dealt to every rank alike (evaluation).
  int64_t data_rank() const { return data() ? data()->rank() : 0; }
  // The training data's share this rank reads, of data_shards(degree), when each sample's tokens are
  // split over `degree` consecutive ranks of a cp group (0: all of them, the job's cp; dynamic context
  // parallelism picks a divisor of it per step): those ranks read the same samples.
  int64_t data_shard(int64_t degree = 0) const {
    return data_rank() / (degree > 0 ? degree : context_parallel());
  }
  int64_t data_shards(int64_t degree = 0) const {
    return data_parallel() * context_parallel() / (degree > 0 ? degree : context_parallel());
  }
  // Whether this rank counts what a step's data holds (samples, tokens, the loss's count) at that
  // degree: the first of the ranks that share its samples.
  bool counts_data(int64_t degree = 0) const {
    return !cp() || cp()->rank() % (degree > 0 ? degree : context_parallel()) == 0;
  }
};

// Forms the job's groups over `world` (null: one process); ConfigError when the layout does not
// fit the world's size.
Layout make_layout(const config::JobConfig& job, std::shared_ptr<dist::Comm> world);

}  // namespace loom::core
