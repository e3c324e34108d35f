// Where this process sits in a multi-process job, read from the environment its launcher set:
// `loom run` and torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE) and
// Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
// OMPI_COMM_WORLD_LOCAL_SIZE). No launcher: one process, rank 0 of 1.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace loom::dist {

struct LaunchEnv {
  int64_t rank = 0, world_size = 1;
  int64_t local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  std::string launcher = "none";  // none | torchrun | slurm | openmpi (loom run sets torchrun's variables)
};

// The value of an environment variable, or nothing when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Reads the launch environment through `env`: torchrun's variables win over Slurm's, Slurm's over
// Open MPI's. Throws loom::DistributedError naming the variable for a value that is not a number,
// out of range (rank outside the world, ...) or missing (MASTER_ADDR for Open MPI across nodes).
LaunchEnv read_launch_env(const EnvLookup& env);
// The same from this process's environment.
LaunchEnv launch_env_from_process();

}  // namespace loom::dist
