#include "loom/core/layout.h"

#include "loom/core/device.h"

namespace loom::core {

Layout make_layout(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  Layout layout;
  const int64_t size = world ? world->size() : 1;
  layout.data_parallel = config::data_parallel_size(job.parallel, size);
  layout.context_parallel = job.parallel.cp;
  layout.device = job_device(job.training);
  if (!world) return layout;
  const auto& p = job.parallel;
  layout.world = std::move(world);
  layout.groups = std::make_shared<dist::ParallelState>(
      layout.world, dist::GridSizes{p.tp, p.cp, p.ep, layout.data_parallel, p.pp});
  layout.data = layout.groups->group({dist::Axis::dp, dist::Axis::cp});
  if (p.tp > 1) layout.tp = layout.groups->group({dist::Axis::tp});
  if (p.pp > 1) layout.pipeline = layout.groups->group({dist::Axis::pp});
  if (p.cp > 1) layout.cp = layout.groups->group({dist::Axis::cp});
  return layout;
}

}  // namespace loom::core
