#include "loom/memory/fp32_reuse.h"

#include "loom/util/errors.h"

namespace loom::memory {

namespace {

void check_pair(const at::Tensor& master, const at::Tensor& bf16, const char* what) {
  if (master.scalar_type() != at::kFloat || bf16.scalar_type() != at::kBFloat16 ||
      master.sizes() != bf16.sizes() || !bf16.is_contiguous())
    throw ModelError(
        fmt::format("{}: needs an fp32 master and a contiguous bf16 tensor of one shape; got {} "
                    "of {} elements and {} of {}",
                    what, c10::toString(master.scalar_type()), master.numel(),
                    c10::toString(bf16.scalar_type()), bf16.numel()));
}

}  // namespace

int64_t SplitMaster::bytes() const {
  return static_cast<int64_t>(residual.nbytes() + ties.size() * sizeof(int64_t));
}

SplitMaster split_master(const at::Tensor& master, at::Tensor bf16) {
  check_pair(master, bf16, "split_master");
  at::NoGradGuard no_grad;
  const at::Tensor w = master.detach().contiguous();
  bf16.copy_(w);  // ATen's rounding to nearest even
  // Integer views of the two fp32 bit patterns: the residual is their difference.
  const at::Tensor high = bf16.to(at::kFloat).view(at::kInt);
  at::Tensor r = w.view(at::kInt) - high;
  r.masked_fill_(w.isnan(), 0);
  const at::Tensor tie = r.eq(0x8000);
  SplitMaster out;
  const at::Tensor index = tie.flatten().nonzero().flatten().contiguous();
  out.ties.assign(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel());
  out.residual = r.masked_fill_(tie, -0x8000).to(at::kShort);
  return out;
}

at::Tensor join_master(const at::Tensor& bf16, const SplitMaster& split) {
  if (!split.residual.defined() || split.residual.scalar_type() != at::kShort ||
      split.residual.sizes() != bf16.sizes() || bf16.scalar_type() != at::kBFloat16)
    throw ModelError("join_master: needs a bf16 tensor and an int16 residual of its shape");
  at::NoGradGuard no_grad;
  at::Tensor r = split.residual.to(at::kInt).flatten();
  if (!split.ties.empty()) {
    const at::Tensor index = at::tensor(split.ties, at::kLong);
    r.index_fill_(0, index, 0x8000);
  }
  const at::Tensor high = bf16.detach().to(at::kFloat).contiguous().view(at::kInt);
  return (high + r.view(bf16.sizes())).view(at::kFloat);
}

}  // namespace loom::memory
