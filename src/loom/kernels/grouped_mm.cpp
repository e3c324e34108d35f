#include "loom/kernels/grouped_mm.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

void check(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ends) {
  if (x.dim() != 2 || w.dim() != 3 || w.size(2) != x.size(1))
    throw ModelError(fmt::format("grouped_mm: x must be (M, K) and w (E, N, K), got [{}] and [{}]",
                                 fmt::join(x.sizes(), ", "), fmt::join(w.sizes(), ", ")));
  if (ends.dim() != 1 || ends.size(0) != w.size(0) || ends.scalar_type() != at::kInt)
    throw ModelError(fmt::format("grouped_mm: ends must be {} int32 group ends, got [{}] {}", w.size(0),
                                 fmt::join(ends.sizes(), ", "), c10::toString(ends.scalar_type())));
  if (x.scalar_type() != w.scalar_type())
    throw ModelError(fmt::format("grouped_mm: x is {} and w {}", c10::toString(x.scalar_type()),
                                 c10::toString(w.scalar_type())));
}

// The groups' row ranges on the host (a device sync where ends is on a GPU).
std::vector<int64_t> starts_of(const at::Tensor& ends, int64_t rows) {
  const at::Tensor host = ends.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> bounds{0};
  for (int64_t e = 0; e < host.numel(); ++e) {
    const int64_t end = host.data_ptr<int64_t>()[e];
    if (end < bounds.back() || end > rows)
      throw ModelError(fmt::format(
          "grouped_mm: group ends must rise from 0 to the {} rows, group {} ends at {}", rows, e, end));
    bounds.push_back(end);
  }
  if (bounds.back() != rows)
    throw ModelError(fmt::format("grouped_mm: the groups end at row {} of {}", bounds.back(), rows));
  return bounds;
}

// Whether at::_grouped_mm takes these operands: 16-byte aligned rows (and pointers).
bool aligned(const at::Tensor& x, const at::Tensor& w) {
  const int64_t bytes = static_cast<int64_t>(x.element_size());
  const auto pointer_ok = [](const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  return (x.size(1) * bytes) % 16 == 0 && (w.size(1) * bytes) % 16 == 0 && x.size(0) > 0 && pointer_ok(x) &&
         pointer_ok(w);
}

// y = x w^T per group, without autograd: x (M, K) and w (E, N, K) contiguous.
at::Tensor forward_product(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ends) {
  if (aligned(x, w)) {
    if (ends.is_cpu()) starts_of(ends, x.size(0));  // checked where that costs no device sync
    return at::_grouped_mm(x, w.transpose(1, 2), ends);
  }
  const std::vector<int64_t> bounds = starts_of(ends, x.size(0));
  at::Tensor y = at::empty({x.size(0), w.size(1)}, x.options());
  for (int64_t e = 0; e < w.size(0); ++e) {
    const int64_t begin = bounds[e], rows = bounds[e + 1] - bounds[e];
    if (rows == 0) continue;
    at::Tensor out = y.narrow(0, begin, rows);
    at::mm_out(out, x.narrow(0, begin, rows), w[e].t());
  }
  return y;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class GroupedMmFunction : public torch::autograd::Function<GroupedMmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in,
                            const at::Tensor& ends) {
    const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
    ctx->save_for_backward({x, w, ends});
    return forward_product(x, w, ends);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &ends = saved[2];
    const at::Tensor dy = grads[0].contiguous();
    at::Tensor dx, dw;
    if (aligned(x, w)) {
      dx = at::_grouped_mm(dy, w, ends);      // (M, N) by (E, N, K) per group
      dw = at::_grouped_mm(dy.t(), x, ends);  // (N, M) by (M, K), M cut by the groups
    } else {
      const std::vector<int64_t> bounds = starts_of(ends, x.size(0));
      dx = at::empty_like(x);
      dw = at::zeros_like(w);
      for (int64_t e = 0; e < w.size(0); ++e) {
        const int64_t begin = bounds[e], rows = bounds[e + 1] - bounds[e];
        if (rows == 0) continue;
        at::Tensor dx_rows = dx.narrow(0, begin, rows), dw_e = dw[e];
        at::mm_out(dx_rows, dy.narrow(0, begin, rows), w[e]);
        at::mm_out(dw_e, dy.narrow(0, begin, rows).t(), x.narrow(0, begin, rows));
      }
    }
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ends) {
  check(x, w, ends);
  return GroupedMmFunction::apply(x, w, ends);
}

at::Tensor grouped_mm_loop(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ends) {
  check(x, w, ends);
  const std::vector<int64_t> bounds = starts_of(ends, x.size(0));
  std::vector<at::Tensor> parts;
  for (int64_t e = 0; e < w.size(0); ++e)
    parts.push_back(at::matmul(x.narrow(0, bounds[e], bounds[e + 1] - bounds[e]), w[e].t()));
  return at::cat(parts, 0);
}

}  // namespace loom::kernels
