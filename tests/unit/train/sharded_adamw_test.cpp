// ShardedAdamW on a one-process group holds every slice, so it must reproduce AdamW plus
// clip_grad_norm exactly; the split over several ranks is checked against one process in
// tests/e2e/data_parallel.sh (ZeRO-1 on 4 ranks, and a ZeRO-1 checkpoint resumed under dp=2).
#include "loom/train/sharded_adamw.h"

#include <gtest/gtest.h>

#include <chrono>

#include "loom/train/schedule.h"
#include "loom/util/errors.h"
#include "one_process_group.h"

namespace loom::train {
namespace {

struct Params {
  at::Tensor w, b, h;  // fp32 matrix (decays), fp32 bias (does not), bf16 matrix
  std::vector<NamedParam> named() const { return {{"w", w}, {"b", b}, {"h", h}}; }
  std::vector<at::Tensor> list() const { return {w, b, h}; }
};

Params make_params() {
  at::manual_seed(7);
  return {at::randn({4, 3}).set_requires_grad(true), at::randn({5}).set_requires_grad(true),
          at::randn({2, 2}).to(at::kBFloat16).set_requires_grad(true)};
}

void backward(const Params& p, int step) {
  const double k = 1.0 + step;
  ((p.w * p.w).sum() * k + (p.b * 3).sum() + (p.h.to(at::kFloat) * p.h.to(at::kFloat)).sum() * 0.5)
      .backward();
}

TEST(ShardedAdamW, OneRankMatchesAdamWWithClippingDecayAndBf16) {
  const AdamWOptions options{0.9, 0.95, 1e-8, 0.1};
  Params a = make_params(), z = make_params();
  AdamW reference(a.named(), options);
  ShardedAdamW sharded(testing::one_process_group(), z.named(), options);
  for (int step = 0; step < 3; ++step) {
    backward(a, step);
    backward(z, step);
    const double norm_a = clip_grad_norm(a.list(), /*max_norm=*/2.0);
    const double norm_z = sharded.reduce_gradients(2.0);
    EXPECT_NEAR(norm_z, norm_a, 1e-5 * norm_a);
    reference.step(1e-2);
    sharded.step(1e-2);
    reference.zero_grad();
    sharded.zero_grad();
    EXPECT_TRUE(z.w.allclose(a.w, 1e-6, 1e-7)) << "step " << step;
    EXPECT_TRUE(z.b.allclose(a.b, 1e-6, 1e-7)) << "step " << step;
    EXPECT_TRUE(z.h.equal(a.h)) << "step " << step;
  }
  // The same state in the same format.
  const auto want = reference.state_dict();
  const auto got = sharded.state_dict();
  ASSERT_EQ(got.size(), want.size());
  // clip_grad_norm scales a bf16 gradient in bf16, the sharded optimizer its fp32 copy: the bf16
  // parameter's state agrees to bf16 precision, the rest to fp32 rounding.
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    const bool bf16 = want[i].first.size() > 2 && want[i].first.substr(want[i].first.size() - 2) == ".h";
    EXPECT_TRUE(got[i].second.allclose(want[i].second, bf16 ? 1e-2 : 1e-6, 1e-7)) << want[i].first;
  }
}

TEST(ShardedAdamW, LoadsAnAdamWStateAndContinuesLikeIt) {
  const AdamWOptions options{0.9, 0.999, 1e-8, 0.0};
  Params a = make_params();
  AdamW reference(a.named(), options);
  backward(a, 0);
  reference.step(1e-2);
  reference.zero_grad();
  std::vector<std::pair<std::string, at::Tensor>> saved;
  for (const auto& [key, value] : reference.state_dict()) saved.emplace_back(key, value.clone());

  Params z{a.w.detach().clone().set_requires_grad(true), a.b.detach().clone().set_requires_grad(true),
           a.h.detach().clone().set_requires_grad(true)};
  ShardedAdamW sharded(testing::one_process_group(), z.named(), options);
  sharded.load_state_dict(saved);
  EXPECT_EQ(sharded.step_count(), 1);
  backward(a, 1);
  backward(z, 1);
  reference.step(1e-2);
  sharded.reduce_gradients(0.0);
  sharded.step(1e-2);
  EXPECT_TRUE(z.w.allclose(a.w, 1e-6, 1e-7));
  EXPECT_TRUE(z.h.equal(a.h));
  // A bad state is refused with AdamW's message and changes nothing.
  saved.pop_back();  // "step"
  EXPECT_THROW(sharded.load_state_dict(saved), CheckpointError);
  EXPECT_EQ(sharded.step_count(), 2);
}

}  // namespace
}  // namespace loom::train
