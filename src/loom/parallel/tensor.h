// Tensor-parallel layers (Megatron style). A model builds these where a layer is split across a
// tensor-parallel group; with a group of one rank they are plain linears and embeddings. Each
// parameter knows how it is cut from its whole HuggingFace tensor (ShardLayout), so weights load,
// initialise and save in whole shapes under any tp.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/dist/comm.h"
#include "loom/parallel/context/shard.h"

namespace loom::parallel {

// The tensor-parallel group a layer is split over, and whether the activations between the
// tensor-parallel regions are split along the sequence (sequence parallelism).
struct TensorParallelGroup {
  std::shared_ptr<dist::Comm> comm;  // null: one rank, nothing is split
  bool sequence_parallel = false;

  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  // Into a region where every rank needs the whole input: the identity (backward: sum of the
  // ranks' gradients), or, under sequence parallelism, the chunks of `seq_dim` gathered.
  at::Tensor enter(const at::Tensor& x, int64_t seq_dim) const;
  // Out of a region whose ranks hold partial sums: all-reduced, or, under sequence parallelism,
  // reduce-scattered along `seq_dim`.
  at::Tensor exit(const at::Tensor& x, int64_t seq_dim) const;
};

// How the parameters a layer holds are created: real CPU storage, or shapes only (meta device),
// and the tensor-parallel group that decides their (local) shapes.
struct ParamOptions {
  at::ScalarType dtype = at::kFloat;
  bool shapes_only = false;
  TensorParallelGroup tp;
  ContextParallelGroup cp;  // what a model's training pass splits each sample's tokens over
  // Expert parallelism: the group a mixture of experts splits its experts over (null: ep 1), and
  // the load over which a hot expert is copied to another rank for a pass (ExpertExchange; 0: never).
  std::shared_ptr<dist::Comm> ep;
  double replicate_above = 0.0;
  at::TensorOptions tensor_options() const;
};

// How a rank's parameter is cut from the whole tensor: along `dim`, the whole is `parts` fused
// blocks (vision qkv: q, k, v), each cut into `chunks` equal slices of which this rank holds
// slice `chunk` of every block. Blocks of unequal sizes (linear attention's q, k and v of other
// widths) are given by `sections`, their whole sizes along `dim`, instead of `parts`. dim < 0: the rank holds
// the whole tensor. With fewer chunks than ranks (kv heads replicated when tp exceeds them), consecutive
// ranks hold the same slice: rank r holds chunk r / replicas(), and each holds part of its gradient.
struct ShardLayout {
  int64_t dim = -1;
  int64_t parts = 1;
  std::vector<int64_t> sections;  // the fused blocks' sizes along dim; empty: `parts` equal blocks
  int64_t chunks = 1;
  int64_t chunk = 0;
  std::shared_ptr<dist::Comm> comm;  // the group whose ranks hold the slices, in slice order
  // A whole parameter used on one chunk of the sequence per rank (sequence parallelism: norms,
  // biases after a reduce-scatter): each rank's gradient is a partial sum over `comm`.
  bool partial_grad = false;
  // The parameter's gradient group: false, the data-parallel group (dp x cp); true, an expert's
  // weights split over the expert-parallel group `comm`, whose gradient already holds every token
  // of that group and is summed over the expert-data-parallel group (the ranks holding the same
  // experts).
  bool expert = false;

  bool split() const { return dim >= 0 && chunks > 1; }
  // How many ranks hold each slice alike (a model with one kv head: every rank, unsplit).
  int64_t replicas() const { return dim >= 0 && comm ? comm->size() / chunks : 1; }
  // This rank's slice of `whole`.
  at::Tensor slice(const at::Tensor& whole) const;
  // The whole tensor from every rank's slice (a collective over `comm`; each rank gets it).
  at::Tensor gather(const at::Tensor& local) const;
  // The whole tensor's shape from a slice's.
  std::vector<int64_t> whole_shape(at::IntArrayRef local) const;
  // The fused blocks' sizes along dim in the whole tensor, `length` long there.
  std::vector<int64_t> whole_blocks(int64_t length) const;
};

// A module that says how its parameters lie over the ranks: cut (the parallel layers), or whole
// with partial gradients (layers run on one sequence chunk per rank). shard_layouts() asks each.
class Sharded {
 public:
  virtual ~Sharded() = default;
  // This module's own parameters (not its children's) by name; those not listed are whole.
  virtual std::map<std::string, ShardLayout> layouts() const = 0;
};

// The heads each rank of a tensor-parallel group of `tp` holds: heads / tp. ConfigError when tp does
// not divide them: "parallel.<option>=<tp>: <whose> <heads> <what> do not split evenly over the
// tensor-parallel ranks".
int64_t heads_per_rank(int64_t heads, int64_t tp, const char* option, const char* whose, const char* what);
// Key/value heads per rank: an equal share, or one when tp is a multiple of them (each kv head
// replicated on the tp / kv ranks whose query heads read it); heads_per_rank's error otherwise.
int64_t kv_heads_per_rank(int64_t kv_heads, int64_t tp, const char* whose);

// A parameter cut along `dim` over `group` (ShardLayout's parts and chunks; chunks 0: the group size).
ShardLayout split_layout(const TensorParallelGroup& group, int64_t dim, int64_t parts = 1,
                         int64_t chunks = 0);
// A parameter of fused blocks of unequal sizes (their whole sizes), each cut along `dim` over `group`.
ShardLayout sections_layout(const TensorParallelGroup& group, int64_t dim, std::vector<int64_t> sections);

// A whole parameter's layout in a layer that `group` runs on: its gradient is partial over the
// group under sequence parallelism (each rank sees one chunk of the tokens).
ShardLayout whole_layout(const TensorParallelGroup& group);

// Experts' weights (experts first) split over the expert-parallel group `ep` in equal consecutive
// blocks of experts; ShardLayout::expert.
ShardLayout expert_layout(const std::shared_ptr<dist::Comm>& ep);

// y = x W^T + b with W (out, in) split along `out` over the group: each rank holds out/size rows
// (of each of `parts` fused blocks of out/parts rows, so every rank gets whole heads of q, k and v).
// `chunks` below the group size (a divisor of it) cuts W into that many slices instead, each held
// by size/chunks consecutive ranks (kv heads replicated when tp exceeds them); 0: the group size.
class ColumnParallelLinear : public torch::nn::Module, public Sharded {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias, const ParamOptions& options,
                       int64_t parts = 1, int64_t chunks = 0);
  // Fused output blocks of unequal sizes (`sections`, summing to the output features), each split
  // over the group: every rank gets its share of each.
  ColumnParallelLinear(int64_t in_features, std::vector<int64_t> sections, bool bias,
                       const ParamOptions& options);
  // x: the whole input, as group().enter() returns it (callers reading one input in several
  // layers enter once) -> (..., out/size); with gather_output, every rank's columns in order.
  at::Tensor forward(const at::Tensor& x, bool gather_output = false) const;
  const TensorParallelGroup& group() const { return group_; }
  std::map<std::string, ShardLayout> layouts() const override;
  at::Tensor weight, bias;

 private:
  TensorParallelGroup group_;
  int64_t parts_, chunks_;
  std::vector<int64_t> sections_;
};

// One parameter, `weight`, of this rank's shape, cut from the whole as `layout` says: a slice of
// the whole, or whole on every rank (whole_layout) where a layer uses it on this rank's part of the
// work (its heads, its sequence chunk).
class ShardedWeight : public torch::nn::Module, public Sharded {
 public:
  ShardedWeight(at::IntArrayRef local_shape, ShardLayout layout, const ParamOptions& options);
  std::map<std::string, ShardLayout> layouts() const override { return {{"weight", layout_}}; }
  at::Tensor weight;

 private:
  ShardLayout layout_;
};

// y = x W^T + b with W (out, in) split along `in`: each rank holds in/size columns; the partial
// products are summed over the group (group().exit()), then the bias is added.
class RowParallelLinear : public torch::nn::Module, public Sharded {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, const ParamOptions& options);
  // x (..., in/size) -> (..., out), whole, or this rank's chunk of `seq_dim` under sequence parallelism.
  at::Tensor forward(const at::Tensor& x, int64_t seq_dim) const;
  const TensorParallelGroup& group() const { return group_; }
  std::map<std::string, ShardLayout> layouts() const override;
  at::Tensor weight, bias;

 private:
  TensorParallelGroup group_;
};

// Token embedding with the vocabulary split over the group: each rank looks up the ids in its
// range, and the rows are summed over the group.
class VocabParallelEmbedding : public torch::nn::Module, public Sharded {
 public:
  VocabParallelEmbedding(int64_t vocab_size, int64_t dim, const ParamOptions& options);
  at::Tensor forward(const at::Tensor& ids) const;  // ids (...) int64 -> (..., dim), whole on every rank
  const TensorParallelGroup& group() const { return group_; }
  std::map<std::string, ShardLayout> layouts() const override;
  int64_t vocab_start() const { return vocab_start_; }
  at::Tensor weight;

 private:
  TensorParallelGroup group_;
  int64_t vocab_start_ = 0;
};

// Every parameter of `root` that a Sharded module under it lists, by its full name, with its
// layout; parameters not listed are whole on every rank, with whole gradients.
std::map<std::string, ShardLayout> shard_layouts(const torch::nn::Module& root);

}  // namespace loom::parallel
