#include "loom/parallel/tensor.h"

#include "loom/util/errors.h"

namespace loom::parallel {

at::TensorOptions ParamOptions::tensor_options() const {
  auto options = at::TensorOptions().dtype(dtype);
  return shapes_only ? options.device(at::kMeta) : options;
}

namespace {

void require_single_rank(const TensorParallelGroup& group, const char* layer) {
  if (group.size != 1)
    throw ConfigError(
        fmt::format("parallel.tp={}: {} needs tensor parallelism, which is not available in this "
                    "version of Loom (valid: 1)",
                    group.size, layer));
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, bool with_bias,
                                           const ParamOptions& options, TensorParallelGroup group)
    : group_(group) {
  require_single_rank(group, "ColumnParallelLinear");
  weight = register_parameter("weight",
                              at::empty({out_features / group.size, in_features}, options.tensor_options()));
  if (with_bias)
    bias = register_parameter("bias", at::empty({out_features / group.size}, options.tensor_options()));
}

at::Tensor ColumnParallelLinear::forward(const at::Tensor& x) const { return at::linear(x, weight, bias); }

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, bool with_bias,
                                     const ParamOptions& options, TensorParallelGroup group)
    : group_(group) {
  require_single_rank(group, "RowParallelLinear");
  weight = register_parameter("weight",
                              at::empty({out_features, in_features / group.size}, options.tensor_options()));
  if (with_bias) bias = register_parameter("bias", at::empty({out_features}, options.tensor_options()));
}

at::Tensor RowParallelLinear::forward(const at::Tensor& x) const { return at::linear(x, weight, bias); }

VocabParallelEmbedding::VocabParallelEmbedding(int64_t vocab_size, int64_t dim, const ParamOptions& options,
                                               TensorParallelGroup group)
    : group_(group) {
  require_single_rank(group, "VocabParallelEmbedding");
  weight = register_parameter("weight", at::empty({vocab_size / group.size, dim}, options.tensor_options()));
}

at::Tensor VocabParallelEmbedding::forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

}  // namespace loom::parallel
