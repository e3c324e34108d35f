// The tests that run as ranks of `loom run -n 4` (tests/e2e/parallel_state.sh) share one world
// group per process: joining a second time on the same port could meet the first store on its way out.
#pragma once
#include <chrono>
#include <memory>

#include "loom/dist/comm.h"
#include "loom/dist/launch_env.h"

namespace loom::dist {

// Null unless this process is one of 4 ranks.
inline std::shared_ptr<Comm> loom_run_world() {
  static const std::shared_ptr<Comm> world = []() -> std::shared_ptr<Comm> {
    const LaunchEnv env = launch_env_from_process();
    if (env.world_size != 4) return nullptr;
    return Comm::connect(env, std::chrono::seconds(60));
  }();
  return world;
}

}  // namespace loom::dist
