// loom run: the launcher that starts a job's processes on this node.
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "loom/dist/launcher.h"

namespace loom::cli {

Command add_run(CLI::App& loom) {
  struct Arguments {
    dist::LaunchOptions launch;
    std::vector<std::string> command;
  };
  auto arguments = std::make_shared<Arguments>();
  auto& launch = arguments->launch;
  auto* command = loom.add_subcommand(
      "run", "Start N processes of a data-parallel job on this node: loom run -n N -- loom train job.yaml");
  command->add_option("-n,--nproc-per-node", launch.nproc_per_node, "Processes on this node")->required();
  command->add_option("--nnodes", launch.nnodes, "Nodes in the job (default 1)");
  command->add_option("--node-rank", launch.node_rank, "This node's index, 0 to nnodes-1 (default 0)");
  command->add_option("--master-addr", launch.master_addr, "Address of node 0 (default 127.0.0.1)");
  command->add_option("--master-port", launch.master_port,
                      "Rendezvous port on node 0 (default: a free port for one node, 29500 for several)");
  command->add_option("command", arguments->command, "The command each process runs, after --")->required();
  return {command, [arguments] { return dist::launch(arguments->launch, arguments->command); }};
}

}  // namespace loom::cli
