// A data-parallel group of one process (its own TCPStore on a free port), for the tests of the
// sharded optimizers and FSDP on one rank.
#pragma once
#include <chrono>
#include <memory>

#include "loom/dist/comm.h"
#include "loom/dist/launch_env.h"

namespace loom::testing {

inline std::shared_ptr<dist::Comm> one_process_group() {
  dist::LaunchEnv env;
  env.master_port = 0;
  return dist::Comm::connect(env, std::chrono::seconds(30));
}

}  // namespace loom::testing
