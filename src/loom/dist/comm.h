// The data-parallel process group: c10d's Gloo backend joined through a TCPStore (and, for a CUDA
// job, NCCL's beside it: CUDA tensors travel through NCCL, CPU tensors and strings through Gloo), with the
// collectives Loom's training loop needs (sum all-reduce of many tensors in flat buckets, string
// all-gather, barrier, all-to-all with unequal splits) and point-to-point send and receive, each
// failure a DistributedError naming this rank, the operation and, for send and receive, the peer.
// Every rank beats a heartbeat into the store from a thread of its own, so that after a failed
// collective the survivors name the ranks whose heartbeat stopped (a killed or hung process), and
// a rank whose peer's heartbeat stood still for the heartbeat timeout (a stopped process: its
// sockets stay open, so no collective fails) ends itself with an error naming that peer.
#pragma once
#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "loom/dist/launch_env.h"

namespace loom::dist {

// A collective in flight. wait() returns once it is done on this rank, or throws a
// DistributedError naming the rank and the operation.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
};

class Comm {
 public:
  // Joins the group of env.world_size processes. Rank 0 serves the TCPStore at
  // env.master_addr:env.master_port; every collective gives up after `timeout`. Once another
  // rank's heartbeat has stood still for `heartbeat_timeout` (or rank 0's store has not answered for
  // that long), this process writes "loom: error: rank R: lost rank Q: ..." and exits with code 1.
  // `device`: the job's; a CUDA one adds NCCL to this group and every subgroup (DistributedError in a
  // build without it).
  static std::shared_ptr<Comm> connect(const LaunchEnv& env, std::chrono::seconds timeout,
                                       std::chrono::seconds heartbeat_timeout = std::chrono::seconds(60),
                                       at::Device device = at::kCPU);
  ~Comm();

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }

  // The ranks `members` of this group (increasing, this rank among them) as a group of their own,
  // called `name` (unique: its rendezvous keys live under it in the store). Only the members call
  // it, each with the same arguments. Errors name world ranks and the group.
  std::shared_ptr<Comm> subgroup(const std::string& name, const std::vector<int64_t>& members) const;

  // Sums each tensor over the ranks, in place. Tensors of one dtype travel together in flat
  // buffers of up to kBucketBytes, so many small gradients cost a few messages.
  void all_reduce_sum(const std::vector<at::Tensor>& tensors);
  // The element-wise mean over the ranks, in place: a sum, then a division (as Gloo's AVG does it),
  // bf16 and half travelling as fp32 like all_reduce_sum's.
  void all_reduce_mean(const std::vector<at::Tensor>& tensors);
  // Starts summing one contiguous tensor over the ranks, in place, and returns at once. Every rank
  // must start its collectives in the same order. `flat` must be contiguous and 1-D; bf16 and
  // half are not accepted on the CPU (Loom sums them in fp32 there): widen them first.
  std::unique_ptr<PendingWork> start_all_reduce_sum(at::Tensor flat);
  // Sums `input` (size() equal chunks, contiguous) over the ranks and writes this rank's chunk of
  // the sum into `output`. Over Gloo an all-to-all moves each chunk to its rank, the same bytes as a
  // ring reduce-scatter, and the rank adds them up: 1.7-2.9x faster than Gloo's own reduce-scatter
  // (PyTorch 2.15, 1-16 MiB over 2 and 4 ranks on 2 cores); NCCL's own runs on GPUs.
  void reduce_scatter_sum(const at::Tensor& input, at::Tensor& output);
  // Every rank's `input` (same size everywhere), concatenated in rank order into `output`.
  // bf16 and half are accepted (a gather only moves their bits).
  void all_gather_flat(const at::Tensor& input, at::Tensor& output);
  // The same two, started and returned at once (wait() before reading `output`). The tensors stay
  // alive until the collective is done.
  std::unique_ptr<PendingWork> start_reduce_scatter_sum(at::Tensor input, at::Tensor output);
  std::unique_ptr<PendingWork> start_all_gather_flat(at::Tensor input, at::Tensor output);
  // Rows (dimension 0) to every rank: the first input_split_sizes[0] rows of `input` go to rank 0,
  // the next input_split_sizes[1] to rank 1, ...; `output` receives output_split_sizes[i] rows from
  // rank i, in rank order. Each list has size() entries summing to its tensor's rows; the rows of
  // both tensors have one shape and dtype, and what rank i sends to rank j is what j expects from
  // i. Any dtype travels (as its rows' bytes, so every dtype takes one path). A
  // non-contiguous `input` is sent from a contiguous copy; a non-contiguous `output` receives into
  // a contiguous buffer copied into it when the exchange is done.
  void all_to_all(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& output_split_sizes,
                  const std::vector<int64_t>& input_split_sizes);
  std::unique_ptr<PendingWork> start_all_to_all(at::Tensor input, at::Tensor output,
                                                std::vector<int64_t> output_split_sizes,
                                                std::vector<int64_t> input_split_sizes);

  // Point-to-point between this rank and `peer`, another rank of this group: starts sending `t`
  // (or receiving into `t`) under `tag` (0 to 2^31 - 1) and returns at once. A send and its
  // receive name the same tag, dtype and number of elements; several may be in flight between two
  // ranks under different tags, and each is matched by its tag. Any dtype travels (a send moves
  // bytes). A non-contiguous `t` is sent from a contiguous copy, or received into a contiguous
  // buffer that wait() copies into `t`.
  std::unique_ptr<PendingWork> start_send(at::Tensor t, int64_t peer, int64_t tag);
  std::unique_ptr<PendingWork> start_recv(at::Tensor t, int64_t peer, int64_t tag);
  // The same, waited for. A send may wait until the peer has posted its receive, so two ranks
  // that send to each other either start both or order them (one sends first, the other receives).
  void send(const at::Tensor& t, int64_t peer, int64_t tag);
  void recv(at::Tensor& t, int64_t peer, int64_t tag);

  // Every rank's string, in rank order.
  std::vector<std::string> all_gather(const std::string& text);
  void barrier();

  static constexpr int64_t kBucketBytes = 25 << 20;

  struct Group;  // the c10d objects, defined in comm.cpp

 private:
  Comm(std::shared_ptr<Group> group, int64_t rank, int64_t size);
  std::shared_ptr<Group> group_;  // shared with the collectives in flight
  int64_t rank_ = 0, size_ = 1;
};

}  // namespace loom::dist
