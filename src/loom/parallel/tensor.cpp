#include "loom/parallel/tensor.h"

#include <fmt/ranges.h>

#include "loom/dist/mappings.h"
#include "loom/util/errors.h"

namespace loom::parallel {

at::Tensor TensorParallelGroup::enter(const at::Tensor& x, int64_t seq_dim) const {
  return sequence_parallel ? dist::gather_from_sequence_region(x, comm, seq_dim)
                           : dist::copy_to_region(x, comm);
}

at::Tensor TensorParallelGroup::exit(const at::Tensor& x, int64_t seq_dim) const {
  return sequence_parallel ? dist::reduce_scatter_to_sequence_region(x, comm, seq_dim)
                           : dist::reduce_from_region(x, comm);
}

at::TensorOptions ParamOptions::tensor_options() const {
  auto options = at::TensorOptions().dtype(dtype);
  return shapes_only ? options.device(at::kMeta) : options;
}

std::vector<int64_t> ShardLayout::whole_blocks(int64_t length) const {
  return sections.empty() ? std::vector<int64_t>(parts, length / parts) : sections;
}

at::Tensor ShardLayout::slice(const at::Tensor& whole) const {
  if (!split()) return whole;
  const std::vector<int64_t> sizes = whole_blocks(whole.size(dim));
  int64_t total = 0;
  bool even = true;
  for (int64_t s : sizes) {
    total += s;
    even = even && s % chunks == 0;
  }
  if (total != whole.size(dim) || !even)
    throw ModelError(
        fmt::format("a [{}] tensor does not split into blocks [{}] of {} equal slices along dimension {}",
                    fmt::join(whole.sizes(), ", "), fmt::join(sizes, ", "), chunks, dim));
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    pieces.push_back(whole.narrow(dim, offset + chunk * (size / chunks), size / chunks));
    offset += size;
  }
  return at::cat(pieces, dim).contiguous();
}

at::Tensor ShardLayout::gather(const at::Tensor& local) const {
  if (!split()) return local;
  if (!comm || comm->size() % chunks != 0)
    throw ModelError(fmt::format("a parameter cut into {} slices cannot be gathered over a group of {} ranks",
                                 chunks, comm ? comm->size() : 1));
  // Rank order along dim: every rank's slice of each block in turn; every replicas()-th rank holds
  // the next chunk. The whole tensor is each block's chunks in order.
  const at::Tensor ranks = dist::all_gather_along(local, *comm, dim);
  const int64_t length = local.size(dim);
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t block : whole_blocks(length * chunks)) {
    const int64_t piece = block / chunks;
    for (int64_t c = 0; c < chunks; ++c)
      pieces.push_back(ranks.narrow(dim, c * replicas() * length + offset, piece));
    offset += piece;
  }
  return at::cat(pieces, dim);
}

std::vector<int64_t> ShardLayout::whole_shape(at::IntArrayRef local) const {
  std::vector<int64_t> shape = local.vec();
  if (split()) shape[dim] *= chunks;
  return shape;
}

namespace {

int64_t split_size(int64_t features, int64_t blocks, const TensorParallelGroup& group, const char* layer,
                   const char* what) {
  if (features % (blocks * group.size()) != 0)
    throw ModelError(fmt::format("{}: {} {} do not split evenly over {} tensor-parallel ranks{}", layer,
                                 features, what, group.size(),
                                 blocks > 1 ? fmt::format(" in each of {} fused blocks", blocks) : ""));
  return features / group.size();
}

}  // namespace

int64_t heads_per_rank(int64_t heads, int64_t tp, const char* option, const char* whose, const char* what) {
  if (tp < 1 || heads % tp != 0)
    throw ConfigError(
        fmt::format("parallel.{}={}: {} {} {} do not split evenly over the tensor-parallel ranks", option, tp,
                    whose, heads, what));
  return heads / tp;
}

int64_t kv_heads_per_rank(int64_t kv_heads, int64_t tp, const char* whose) {
  if (tp > kv_heads && tp % kv_heads == 0) return 1;
  return heads_per_rank(kv_heads, tp, "tp", whose, "key/value heads");
}

ShardLayout split_layout(const TensorParallelGroup& group, int64_t dim, int64_t parts, int64_t chunks) {
  ShardLayout layout;
  layout.dim = dim;
  layout.parts = parts;
  layout.chunks = chunks > 0 ? chunks : group.size();
  layout.chunk = group.rank() / (group.size() / layout.chunks);
  layout.comm = group.comm;
  return layout;
}

ShardLayout sections_layout(const TensorParallelGroup& group, int64_t dim, std::vector<int64_t> sections) {
  ShardLayout layout = split_layout(group, dim, static_cast<int64_t>(sections.size()));
  layout.sections = std::move(sections);
  return layout;
}

ShardedWeight::ShardedWeight(at::IntArrayRef local_shape, ShardLayout layout, const ParamOptions& options)
    : layout_(std::move(layout)) {
  weight = register_parameter("weight", at::empty(local_shape, options.tensor_options()));
}

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, std::vector<int64_t> sections, bool with_bias,
                                           const ParamOptions& options)
    : group_(options.tp),
      parts_(static_cast<int64_t>(sections.size())),
      chunks_(options.tp.size()),
      sections_(std::move(sections)) {
  int64_t local = 0;
  for (int64_t s : sections_)
    local += split_size(s, 1, group_, "ColumnParallelLinear", "output features of a block");
  weight = register_parameter("weight", at::empty({local, in_features}, options.tensor_options()));
  if (with_bias) bias = register_parameter("bias", at::empty({local}, options.tensor_options()));
}

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, bool with_bias,
                                           const ParamOptions& options, int64_t parts, int64_t chunks)
    : group_(options.tp), parts_(parts), chunks_(chunks > 0 ? chunks : options.tp.size()) {
  if (group_.size() % chunks_ != 0)
    throw ModelError(
        fmt::format("ColumnParallelLinear: {} slices cannot be shared by {} tensor-parallel ranks", chunks_,
                    group_.size()));
  const int64_t local = chunks_ == group_.size() ? split_size(out_features, parts, group_,
                                                              "ColumnParallelLinear", "output features")
                                                 : out_features / chunks_;
  if (chunks_ != group_.size() && out_features % (parts * chunks_) != 0)
    throw ModelError(fmt::format("ColumnParallelLinear: {} output features do not split into {} slices",
                                 out_features, chunks_));
  weight = register_parameter("weight", at::empty({local, in_features}, options.tensor_options()));
  if (with_bias) bias = register_parameter("bias", at::empty({local}, options.tensor_options()));
}

at::Tensor ColumnParallelLinear::forward(const at::Tensor& x, bool gather_output) const {
  auto y = at::linear(x, weight, bias);
  if (!gather_output || group_.size() == 1) return y;
  if (parts_ != 1 || chunks_ != group_.size())
    throw ModelError(
        "ColumnParallelLinear: gathering the output of fused blocks or of slices shared by several ranks is "
        "not supported");
  return dist::gather_from_region(y, group_.comm, -1);
}

std::map<std::string, ShardLayout> ColumnParallelLinear::layouts() const {
  const ShardLayout layout =
      sections_.empty() ? split_layout(group_, 0, parts_, chunks_) : sections_layout(group_, 0, sections_);
  std::map<std::string, ShardLayout> out{{"weight", layout}};
  if (bias.defined()) out["bias"] = layout;
  return out;
}

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, bool with_bias,
                                     const ParamOptions& options)
    : group_(options.tp) {
  const int64_t local = split_size(in_features, 1, group_, "RowParallelLinear", "input features");
  weight = register_parameter("weight", at::empty({out_features, local}, options.tensor_options()));
  if (with_bias) bias = register_parameter("bias", at::empty({out_features}, options.tensor_options()));
}

at::Tensor RowParallelLinear::forward(const at::Tensor& x, int64_t seq_dim) const {
  if (group_.size() == 1) return at::linear(x, weight, bias);
  auto y = group_.exit(at::linear(x, weight), seq_dim);
  return bias.defined() ? y + bias : y;
}

std::map<std::string, ShardLayout> RowParallelLinear::layouts() const {
  std::map<std::string, ShardLayout> out{{"weight", split_layout(group_, 1)}};
  // The bias is added to each rank's sequence chunk under sequence parallelism.
  if (bias.defined()) out["bias"] = whole_layout(group_);
  return out;
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t vocab_size, int64_t dim, const ParamOptions& options)
    : group_(options.tp) {
  const int64_t local = split_size(vocab_size, 1, group_, "VocabParallelEmbedding", "vocabulary rows");
  vocab_start_ = local * group_.rank();
  weight = register_parameter("weight", at::empty({local, dim}, options.tensor_options()));
}

at::Tensor VocabParallelEmbedding::forward(const at::Tensor& ids) const {
  if (group_.size() == 1) return at::embedding(weight, ids);
  // Ids outside this rank's rows look up row 0 and are zeroed; the sum over ranks fills them in.
  const auto outside = (ids < vocab_start_).logical_or(ids >= vocab_start_ + weight.size(0));
  const auto local_ids = (ids - vocab_start_).masked_fill(outside, 0);
  auto rows = at::embedding(weight, local_ids).masked_fill(outside.unsqueeze(-1), 0.0);
  return dist::reduce_from_region(rows, group_.comm);
}

std::map<std::string, ShardLayout> VocabParallelEmbedding::layouts() const {
  return {{"weight", split_layout(group_, 0)}};
}

ShardLayout expert_layout(const std::shared_ptr<dist::Comm>& ep) {
  ShardLayout layout;
  layout.dim = 0;
  layout.chunks = ep->size();
  layout.chunk = ep->rank();
  layout.comm = ep;
  layout.expert = true;
  return layout;
}

ShardLayout whole_layout(const TensorParallelGroup& group) {
  ShardLayout whole;
  whole.comm = group.comm;
  whole.partial_grad = group.sequence_parallel && group.size() > 1;
  return whole;
}

std::map<std::string, ShardLayout> shard_layouts(const torch::nn::Module& root) {
  std::map<std::string, ShardLayout> out;
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const auto* sharded = dynamic_cast<const Sharded*>(item.value().get());
    if (!sharded) continue;
    for (auto& [name, layout] : sharded->layouts())
      out[item.key().empty() ? name : item.key() + "." + name] = std::move(layout);
  }
  return out;
}

}  // namespace loom::parallel
