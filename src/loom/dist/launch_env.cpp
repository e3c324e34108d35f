// Launch environment: torchrun, Slurm and Open MPI variables to one LaunchEnv.
#include "loom/dist/launch_env.h"

#include <fmt/format.h>

#include <cstdlib>
#include <utility>

#include "loom/util/errors.h"

namespace loom::dist {
namespace {

// The integer `text` starts with and how many characters it took; 0 characters when none.
std::pair<int64_t, size_t> leading_integer(const std::string& text) {
  size_t used = 0;
  try {
    const int64_t value = std::stoll(text, &used);
    return {value, used};
  } catch (const std::exception&) {
    return {0, 0};
  }
}

int64_t number(const EnvLookup& env, const std::string& name, int64_t minimum) {
  const std::string text = *env(name);
  const auto [value, used] = leading_integer(text);
  if (used == 0 || used != text.size())
    throw DistributedError(fmt::format("environment: {}='{}' is not an integer", name, text));
  if (value < minimum)
    throw DistributedError(fmt::format("environment: {}={} must be >= {}", name, value, minimum));
  return value;
}

// Slurm writes tasks per node as "2" or "2(x3)" (three nodes with two each) or "2,1": the first count.
int64_t slurm_tasks_per_node(const EnvLookup& env) {
  const auto text = env("SLURM_NTASKS_PER_NODE");
  if (!text) return -1;
  const auto [value, used] = leading_integer(*text);
  if (used == 0 || value < 1)
    throw DistributedError(
        fmt::format("environment: SLURM_NTASKS_PER_NODE='{}' does not start with a "
                    "task count",
                    *text));
  return value;
}

void read_master(const EnvLookup& env, LaunchEnv& out, const std::optional<std::string>& fallback_addr) {
  if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
    out.master_addr = *addr;
  } else if (fallback_addr) {
    out.master_addr = *fallback_addr;
  } else if (out.local_world_size < out.world_size) {
    throw DistributedError(
        fmt::format("environment: {} launched {} processes over several nodes but MASTER_ADDR is not set "
                    "(the address of rank 0's node)",
                    out.launcher, out.world_size));
  }
  if (env("MASTER_PORT")) {
    out.master_port = number(env, "MASTER_PORT", 1);
    if (out.master_port > 65535)
      throw DistributedError(fmt::format("environment: MASTER_PORT={} is not a TCP port", out.master_port));
  }
}

void check(const LaunchEnv& e, const std::string& rank_name, const std::string& size_name,
           const std::string& local_rank_name, const std::string& local_size_name) {
  if (e.rank >= e.world_size)
    throw DistributedError(
        fmt::format("environment: {}={} is outside {}={}", rank_name, e.rank, size_name, e.world_size));
  if (e.local_rank >= e.local_world_size)
    throw DistributedError(fmt::format("environment: {}={} is outside {}={}", local_rank_name, e.local_rank,
                                       local_size_name, e.local_world_size));
  if (e.local_world_size > e.world_size)
    throw DistributedError(fmt::format("environment: {}={} exceeds {}={}", local_size_name,
                                       e.local_world_size, size_name, e.world_size));
}

}  // namespace

LaunchEnv read_launch_env(const EnvLookup& env) {
  LaunchEnv out;
  if (env("RANK") || env("WORLD_SIZE")) {
    if (!env("RANK") || !env("WORLD_SIZE"))
      throw DistributedError("environment: RANK and WORLD_SIZE must be set together (torchrun sets both)");
    out.launcher = "torchrun";
    out.rank = number(env, "RANK", 0);
    out.world_size = number(env, "WORLD_SIZE", 1);
    out.local_rank = env("LOCAL_RANK") ? number(env, "LOCAL_RANK", 0) : out.rank;
    out.local_world_size = env("LOCAL_WORLD_SIZE") ? number(env, "LOCAL_WORLD_SIZE", 1) : out.world_size;
    check(out, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    read_master(env, out, std::nullopt);
    return out;
  }
  if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    out.launcher = "slurm";
    out.rank = number(env, "SLURM_PROCID", 0);
    out.world_size = number(env, "SLURM_NTASKS", 1);
    out.local_rank = env("SLURM_LOCALID") ? number(env, "SLURM_LOCALID", 0) : 0;
    int64_t per_node = slurm_tasks_per_node(env);
    if (per_node < 0 && env("SLURM_NNODES")) {
      const int64_t nodes = number(env, "SLURM_NNODES", 1);
      per_node = (out.world_size + nodes - 1) / nodes;
    }
    out.local_world_size = per_node > 0 ? per_node : out.world_size;
    check(out, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
    read_master(env, out, env("SLURM_LAUNCH_NODE_IPADDR"));
    return out;
  }
  if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    out.launcher = "openmpi";
    out.rank = number(env, "OMPI_COMM_WORLD_RANK", 0);
    out.world_size = number(env, "OMPI_COMM_WORLD_SIZE", 1);
    out.local_rank = env("OMPI_COMM_WORLD_LOCAL_RANK") ? number(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0) : 0;
    out.local_world_size =
        env("OMPI_COMM_WORLD_LOCAL_SIZE") ? number(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) : out.world_size;
    check(out, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE");
    read_master(env, out, std::nullopt);
    return out;
  }
  return out;
}

LaunchEnv launch_env_from_process() {
  return read_launch_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace loom::dist
