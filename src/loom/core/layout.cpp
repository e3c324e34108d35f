#include "loom/core/layout.h"

#include "loom/core/device.h"

namespace loom::core {

Layout make_layout(const config::JobConfig& job, std::shared_ptr<dist::Comm> world) {
  Layout layout;
  layout.device = job_device(job.training);
  if (!world) return layout;
  const auto& p = job.parallel;
  const int64_t dp = config::data_parallel_size(p, world->size());
  layout.parallel = std::make_shared<const dist::ParallelState>(std::move(world),
                                                                dist::GridSizes{p.tp, p.cp, p.ep, dp, p.pp});
  return layout;
}

}  // namespace loom::core
