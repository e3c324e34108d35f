#include "loom/dist/mappings.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "loom/util/errors.h"

namespace loom::dist {
namespace {

using Transform = std::function<at::Tensor(const at::Tensor&)>;

// The backward node of one mapping: the gradient of its output, transformed into its input's.
class MappingBackward : public torch::autograd::Node {
 public:
  MappingBackward(std::string name, Transform backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads.at(0).defined()) return {at::Tensor()};
    return {backward_(grads[0])};
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Transform backward_;
};

bool trivial(const std::shared_ptr<Comm>& group) { return !group || group->size() == 1; }

// Runs `forward` on x outside autograd and, when x needs a gradient, makes its result an output
// of a node whose backward is `backward`.
at::Tensor mapped(const char* name, const at::Tensor& x, const Transform& forward, Transform backward) {
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = forward(x.detach());
  }
  if (!x.requires_grad() || !at::GradMode::is_enabled()) return y;
  auto node = c10::make_intrusive<MappingBackward>(name, std::move(backward));
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(y, node);
  return y;
}

int64_t normalized_dim(const at::Tensor& x, int64_t dim) { return dim < 0 ? dim + x.dim() : dim; }

void check_chunks(const at::Tensor& x, const Comm& group, int64_t dim, const char* what) {
  if (dim < 0 || dim >= x.dim() || x.size(dim) % group.size() != 0)
    throw DistributedError(
        fmt::format("{}: dimension {} of a [{}] tensor does not split into {} equal chunks", what, dim,
                    fmt::join(x.sizes(), ", "), group.size()));
}

at::Tensor own_chunk(const at::Tensor& x, const Comm& group, int64_t dim) {
  check_chunks(x, group, dim, "scatter");
  return x.chunk(group.size(), dim)[group.rank()].contiguous();
}

at::Tensor all_reduced(const at::Tensor& x, Comm& group) {
  at::Tensor sum = x.clone(at::MemoryFormat::Contiguous);
  group.all_reduce_sum({sum});
  return sum;
}

// x's rows to the ranks by input_splits, the rows received by output_splits (Comm checks both).
at::Tensor exchanged_rows(const at::Tensor& x, Comm& group, const std::vector<int64_t>& output_splits,
                          const std::vector<int64_t>& input_splits) {
  std::vector<int64_t> shape = x.dim() == 0 ? std::vector<int64_t>{0} : x.sizes().vec();
  shape[0] = 0;
  for (int64_t rows : output_splits) shape[0] += std::max<int64_t>(rows, 0);
  at::Tensor out = at::empty(shape, x.options());
  group.all_to_all(x, out, output_splits, input_splits);
  return out;
}

// x (..., P * c at scatter_dim, ..., g at gather_dim, ...) -> (..., c, ..., P * g, ...): chunk j of
// scatter_dim to rank j, the chunks received concatenated along gather_dim in rank order.
at::Tensor resharded(const at::Tensor& x, Comm& group, int64_t scatter_dim, int64_t gather_dim) {
  check_chunks(x, group, scatter_dim, "all-to-all");
  if (gather_dim < 0 || gather_dim >= x.dim())
    throw DistributedError(fmt::format("all-to-all: a [{}] tensor has no dimension {} to gather along",
                                       fmt::join(x.sizes(), ", "), gather_dim));
  const int64_t ranks = group.size();
  std::vector<int64_t> piece = x.sizes().vec();  // one chunk
  piece[scatter_dim] /= ranks;
  std::vector<int64_t> split = piece;
  split.insert(split.begin() + scatter_dim, ranks);
  // (..., ranks * c, ...) -> (ranks, ..., c, ...), contiguous: rank j's chunk is block j.
  const at::Tensor blocks = x.reshape(split).movedim(scatter_dim, 0).contiguous();
  const int64_t block = blocks.numel() / ranks;
  at::Tensor received = at::empty({ranks, block}, x.options());
  const std::vector<int64_t> one_each(static_cast<size_t>(ranks), 1);
  group.all_to_all(blocks.view({ranks, block}), received, one_each, one_each);
  std::vector<int64_t> stacked{ranks};
  stacked.insert(stacked.end(), piece.begin(), piece.end());
  std::vector<int64_t> whole = piece;
  whole[gather_dim] *= ranks;
  // (ranks, ..., g, ...) -> (..., ranks, g, ...): rank-major along gather_dim.
  return received.view(stacked).movedim(0, gather_dim).reshape(whole);
}

}  // namespace

at::Tensor all_gather_along(const at::Tensor& x, Comm& group, int64_t dim) {
  dim = normalized_dim(x, dim);
  const at::Tensor piece = x.contiguous();
  at::Tensor gathered = at::empty({group.size() * piece.numel()}, piece.options());
  group.all_gather_flat(piece.view({-1}), gathered);
  std::vector<int64_t> stacked{group.size()};
  stacked.insert(stacked.end(), piece.sizes().begin(), piece.sizes().end());
  std::vector<int64_t> whole = piece.sizes().vec();
  whole[dim] *= group.size();
  // (ranks, ..., d, ...) -> (..., ranks, d, ...): rank-major along dim.
  return gathered.view(stacked).movedim(0, dim).reshape(whole);
}

at::Tensor reduce_scatter_along(const at::Tensor& x, Comm& group, int64_t dim) {
  dim = normalized_dim(x, dim);
  check_chunks(x, group, dim, "reduce-scatter");
  // bf16 and half are summed in fp32 (one rounding per sum, as Comm::all_reduce_sum's).
  const bool widen = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  const at::Tensor full = widen ? x.to(at::kFloat) : x;
  std::vector<int64_t> split = full.sizes().vec();
  split[dim] /= group.size();
  split.insert(split.begin() + dim, group.size());
  // (..., ranks * c, ...) -> (ranks, ..., c, ...), contiguous: rank r's chunk is block r.
  const at::Tensor blocks = full.reshape(split).movedim(dim, 0).contiguous();
  std::vector<int64_t> mine = full.sizes().vec();
  mine[dim] /= group.size();
  at::Tensor out = at::empty({blocks.numel() / group.size()}, blocks.options());
  group.reduce_scatter_sum(blocks.view({-1}), out);
  out = out.view(mine);
  return widen ? out.to(x.scalar_type()) : out;
}

at::Tensor copy_to_region(const at::Tensor& x, const std::shared_ptr<Comm>& group) {
  if (trivial(group)) return x;
  return mapped(
      "CopyToRegion", x, [](const at::Tensor& t) { return t; },
      [group](const at::Tensor& g) { return all_reduced(g, *group); });
}

at::Tensor reduce_from_region(const at::Tensor& x, const std::shared_ptr<Comm>& group) {
  if (trivial(group)) return x;
  return mapped(
      "ReduceFromRegion", x, [group](const at::Tensor& t) { return all_reduced(t, *group); },
      [](const at::Tensor& g) { return g; });
}

at::Tensor sum_over_region(const at::Tensor& x, const std::shared_ptr<Comm>& group) {
  if (trivial(group)) return x;
  return mapped(
      "SumOverRegion", x, [group](const at::Tensor& t) { return all_reduced(t, *group); },
      [group](const at::Tensor& g) { return all_reduced(g, *group); });
}

at::Tensor scatter_to_region(const at::Tensor& x, const std::shared_ptr<Comm>& group, int64_t dim) {
  if (trivial(group)) return x;
  dim = normalized_dim(x, dim);
  return mapped(
      "ScatterToRegion", x, [group, dim](const at::Tensor& t) { return own_chunk(t, *group, dim); },
      [group, dim](const at::Tensor& g) { return all_gather_along(g, *group, dim); });
}

at::Tensor gather_from_region(const at::Tensor& x, const std::shared_ptr<Comm>& group, int64_t dim) {
  if (trivial(group)) return x;
  dim = normalized_dim(x, dim);
  return mapped(
      "GatherFromRegion", x, [group, dim](const at::Tensor& t) { return all_gather_along(t, *group, dim); },
      [group, dim](const at::Tensor& g) { return own_chunk(g, *group, dim); });
}

at::Tensor gather_from_sequence_region(const at::Tensor& x, const std::shared_ptr<Comm>& group, int64_t dim) {
  if (trivial(group)) return x;
  dim = normalized_dim(x, dim);
  return mapped(
      "GatherFromSequenceRegion", x,
      [group, dim](const at::Tensor& t) { return all_gather_along(t, *group, dim); },
      [group, dim](const at::Tensor& g) { return reduce_scatter_along(g, *group, dim); });
}

at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const std::shared_ptr<Comm>& group,
                                             int64_t dim) {
  if (trivial(group)) return x;
  dim = normalized_dim(x, dim);
  return mapped(
      "ReduceScatterToSequenceRegion", x,
      [group, dim](const at::Tensor& t) { return reduce_scatter_along(t, *group, dim); },
      [group, dim](const at::Tensor& g) { return all_gather_along(g, *group, dim); });
}

at::Tensor all_to_all(const at::Tensor& x, const std::shared_ptr<Comm>& group,
                      std::vector<int64_t> output_splits, std::vector<int64_t> input_splits) {
  if (trivial(group)) return x;
  return mapped(
      "AllToAll", x,
      [group, output_splits, input_splits](const at::Tensor& t) {
        return exchanged_rows(t, *group, output_splits, input_splits);
      },
      [group, output_splits, input_splits](const at::Tensor& g) {
        return exchanged_rows(g, *group, input_splits, output_splits);
      });
}

StartedRows start_all_to_all(const at::Tensor& x, const std::shared_ptr<Comm>& group,
                             std::vector<int64_t> output_splits, std::vector<int64_t> input_splits) {
  StartedRows started;
  if (trivial(group)) {
    started.rows = x;
    return started;
  }
  started.rows = mapped(
      "AllToAll", x,
      [&](const at::Tensor& t) {
        std::vector<int64_t> shape = t.sizes().vec();
        shape[0] = 0;
        for (int64_t rows : output_splits) shape[0] += std::max<int64_t>(rows, 0);
        at::Tensor out = at::empty(shape, t.options());
        started.work = group->start_all_to_all(t, out, output_splits, input_splits);
        return out;
      },
      [group, output_splits, input_splits](const at::Tensor& g) {
        return exchanged_rows(g, *group, input_splits, output_splits);
      });
  return started;
}

at::Tensor all_to_all_reshard(const at::Tensor& x, const std::shared_ptr<Comm>& group, int64_t scatter_dim,
                              int64_t gather_dim) {
  if (trivial(group)) return x;
  scatter_dim = normalized_dim(x, scatter_dim);
  gather_dim = normalized_dim(x, gather_dim);
  return mapped(
      "AllToAllReshard", x,
      [group, scatter_dim, gather_dim](const at::Tensor& t) {
        return resharded(t, *group, scatter_dim, gather_dim);
      },
      [group, scatter_dim, gather_dim](const at::Tensor& g) {
        return resharded(g, *group, gather_dim, scatter_dim);
      });
}

}  // namespace loom::dist
