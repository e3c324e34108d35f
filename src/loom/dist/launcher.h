// `loom run`: starts this node's processes of a multi-process job with the environment torchrun
// gives (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), forwards their
// output line by line behind a rank prefix, and when one exits with an error stops the others and
// exits with that rank's code.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::dist {

struct LaunchOptions {
  int64_t nproc_per_node = 1;
  int64_t nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;    // 0: a free port on this machine (one node only), else 29500 across nodes
  int64_t stop_grace_s = 10;  // SIGTERM, then SIGKILL after this long
};

// Runs `command` (argv) once per local rank and waits for all of them. Returns 0 when every
// rank succeeded, else the first failing rank's exit code (128 + signal for a killed rank).
// Throws loom::DistributedError for bad options or a command that cannot start.
int launch(const LaunchOptions& options, const std::vector<std::string>& command);

}  // namespace loom::dist
