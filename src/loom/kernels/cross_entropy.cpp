#include "loom/kernels/cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels, int64_t chunk_rows) {
  if (hidden.dim() != 2 || weight.dim() != 2 || hidden.size(1) != weight.size(1) || labels.dim() != 1 ||
      labels.size(0) != hidden.size(0))
    throw ModelError(fmt::format(
        "linear_cross_entropy: needs hidden (N, H), weight (V, H) and labels (N); got [{}], [{}] and [{}]",
        fmt::join(hidden.sizes(), ", "), fmt::join(weight.sizes(), ", "), fmt::join(labels.sizes(), ", ")));
  if (chunk_rows < 1)
    throw ModelError(fmt::format("linear_cross_entropy: chunk_rows must be >= 1, got {}", chunk_rows));
}

// Forward computes each chunk's logits once and, when a gradient will be wanted, turns them at
// once into that chunk's share of d hidden and d weight for a unit loss gradient (Liger's fused
// linear cross-entropy): backward only scales them, so the head costs the composite's three
// products and no recomputation, and holds one chunk of logits at a time.
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t ignore_index, int64_t chunk_rows) {
    const int64_t n = hidden.size(0), vocab = weight.size(0);
    const at::Tensor y = labels.to(hidden.device(), at::kLong).contiguous();
    const at::Tensor counted = y.ne(ignore_index);
    if (counted.logical_and(y.lt(0).logical_or(y.ge(vocab))).any().item<bool>())
      throw ModelError(fmt::format("linear_cross_entropy: a label lies outside the vocabulary of {}", vocab));
    const bool want_grad = hidden.requires_grad() || weight.requires_grad();
    at::Tensor d_hidden, d_weight;
    if (want_grad) {
      d_hidden = at::empty_like(hidden);
      d_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    }
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kDouble));
    for (int64_t begin = 0; begin < n; begin += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - begin);
      const at::Tensor h = hidden.narrow(0, begin, rows);
      at::Tensor logits = at::matmul(h, weight.t()).to(at::kFloat);  // (rows, V)
      const at::Tensor lse = at::logsumexp(logits, 1);
      const at::Tensor labels_c = y.narrow(0, begin, rows).clamp(0, vocab - 1).unsqueeze(1);
      const at::Tensor mask = counted.narrow(0, begin, rows);
      const at::Tensor picked = logits.gather(1, labels_c).squeeze(1);
      total += (lse - picked).masked_fill(mask.logical_not(), 0.0).sum().to(at::kDouble);
      if (!want_grad) continue;
      // d logits = softmax - onehot(label) on counted rows, in place of the logits.
      logits.sub_(lse.unsqueeze(1)).exp_();
      logits.scatter_add_(1, labels_c, at::full({rows, 1}, -1.0F, logits.options()));
      logits.mul_(mask.unsqueeze(1).to(at::kFloat));
      const at::Tensor d = logits.to(hidden.scalar_type());
      d_hidden.narrow(0, begin, rows).copy_(at::matmul(d, weight));
      d_weight.add_(at::matmul(d.t(), h).to(at::kFloat));
    }
    ctx->save_for_backward({d_hidden, want_grad ? d_weight.to(weight.scalar_type()) : d_weight});
    return total.to(at::kFloat);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor scale = grads[0];
    return {saved[0] * scale.to(saved[0].scalar_type()), saved[1] * scale.to(saved[1].scalar_type()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                    const at::Tensor& labels, int64_t ignore_index, int64_t chunk_rows) {
  check(hidden, weight, labels, chunk_rows);
  return LinearCrossEntropyFunction::apply(hidden, weight, labels, ignore_index, chunk_rows);
}

at::Tensor linear_cross_entropy_sum_composite(const at::Tensor& hidden, const at::Tensor& weight,
                                              const at::Tensor& labels, int64_t ignore_index) {
  return at::cross_entropy_loss(at::linear(hidden, weight).to(at::kFloat), labels.to(hidden.device()), {},
                                at::Reduction::Sum, ignore_index);
}

}  // namespace loom::kernels
