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

// ZeRO-1 with split masters (features.reuse_fp32_param): the same steps as the fp32 master slice,
// bit for bit, in 2 bytes less per slice element; a state saved by either loads into the other.
TEST(ShardedAdamW, SplitMastersStepLikeTheFp32SliceAndLoadItsState) {
  AdamWOptions options{0.9, 0.95, 1e-8, 0.1};
  auto bf16_params = [] {
    at::manual_seed(9);
    return std::vector<at::Tensor>{at::randn({40, 30}).to(at::kBFloat16).set_requires_grad(true),
                                   at::randn({17}).to(at::kBFloat16).set_requires_grad(true)};
  };
  auto named = [](const std::vector<at::Tensor>& p) {
    return std::vector<NamedParam>{{"m", p[0]}, {"v", p[1]}};
  };
  auto backward_on = [](const std::vector<at::Tensor>& p, int step) {
    ((p[0].to(at::kFloat).pow(2).sum() * (1.0 + step)) + p[1].to(at::kFloat).sin().sum()).backward();
  };
  const auto plain_params = bf16_params(), split_params = bf16_params();
  ShardedAdamW plain(testing::one_process_group(), named(plain_params), options);
  options.split_master = true;
  ShardedAdamW split(testing::one_process_group(), named(split_params), options);
  EXPECT_EQ(plain.state_bytes() - split.state_bytes(), 2 * (40 * 30 + 17));
  auto steps = [&](ShardedAdamW& a, const std::vector<at::Tensor>& pa, ShardedAdamW& b,
                   const std::vector<at::Tensor>& pb, int from, int to) {
    for (int step = from; step < to; ++step) {
      backward_on(pa, step);
      backward_on(pb, step);
      a.reduce_gradients(1.0);
      b.reduce_gradients(1.0);
      a.step(1e-2);
      b.step(1e-2);
      a.zero_grad();
      b.zero_grad();
      for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pb[i].equal(pa[i])) << "step " << step;
      const auto sa = a.state_dict(), sb = b.state_dict();
      ASSERT_EQ(sa.size(), sb.size());
      for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(sb[i].second.equal(sa[i].second)) << sa[i].first;
    }
  };
  steps(plain, plain_params, split, split_params, 0, 3);
  // Each state into a fresh optimizer of the other kind, on copies of the parameters.
  for (const bool into_split : {true, false}) {
    std::vector<at::Tensor> copies;
    for (const auto& p : split_params) copies.push_back(p.detach().clone().set_requires_grad(true));
    options.split_master = into_split;
    ShardedAdamW loaded(testing::one_process_group(), named(copies), options);
    loaded.load_state_dict(into_split ? plain.state_dict() : split.state_dict());
    ShardedAdamW& from = into_split ? plain : split;
    const auto& from_params = into_split ? plain_params : split_params;
    steps(from, from_params, loaded, copies, 3, 5);
  }
}

}  // namespace
}  // namespace loom::train
