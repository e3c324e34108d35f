// Launch environments of torchrun (and loom run), Slurm and Open MPI read into one LaunchEnv.
#include "loom/dist/launch_env.h"

#include <gtest/gtest.h>

#include <map>

#include "loom/util/errors.h"

namespace loom::dist {
namespace {

LaunchEnv read(const std::map<std::string, std::string>& vars) {
  return read_launch_env([&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    read(vars);
  } catch (const DistributedError& e) {
    return e.what();
  }
  return "no error";
}

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchEnv e = read({});
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.launcher, "none");
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv e = read({{"RANK", "5"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_RANK", "1"},
                            {"LOCAL_WORLD_SIZE", "4"},
                            {"MASTER_ADDR", "10.0.0.7"},
                            {"MASTER_PORT", "29600"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 29600);
}

TEST(LaunchEnv, SlurmWithItsNodeAddressAndTaskCounts) {
  const LaunchEnv e = read({{"SLURM_PROCID", "3"},
                            {"SLURM_NTASKS", "6"},
                            {"SLURM_LOCALID", "1"},
                            {"SLURM_NTASKS_PER_NODE", "2(x3)"},
                            {"SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 6);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, OpenMpiOnOneNodeNeedsNoAddress) {
  const LaunchEnv e = read({{"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
}

TEST(LaunchEnv, TorchrunVariablesWinOverSlurm) {
  const LaunchEnv e =
      read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "8"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.world_size, 2);
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  EXPECT_EQ(error_of({{"RANK", "one"}, {"WORLD_SIZE", "2"}}), "environment: RANK='one' is not an integer");
  EXPECT_EQ(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), "environment: RANK=2 is outside WORLD_SIZE=2");
  EXPECT_EQ(error_of({{"RANK", "0"}}),
            "environment: RANK and WORLD_SIZE must be set together (torchrun sets both)");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
            "environment: MASTER_PORT=70000 is not a TCP port");
  EXPECT_EQ(error_of({{"OMPI_COMM_WORLD_RANK", "0"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
            "environment: openmpi launched 4 processes over several nodes but MASTER_ADDR is not set (the "
            "address of rank 0's node)");
}

}  // namespace
}  // namespace loom::dist
