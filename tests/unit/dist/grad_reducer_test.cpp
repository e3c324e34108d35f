// GradReducer on a one-process group (the sum over one rank is the gradient itself): bucket layout,
// which buckets start during backward, gradient accumulation and unused parameters. Sums over
// several ranks are tested against one process in tests/e2e/data_parallel.sh.
#include "loom/dist/grad_reducer.h"

#include <gtest/gtest.h>

#include <chrono>

namespace loom::dist {
namespace {

std::shared_ptr<Comm> one_process() {
  LaunchEnv env;
  env.master_port = 0;  // a free port
  return Comm::connect(env, std::chrono::seconds(30));
}

at::Tensor param(int64_t n, float value) { return at::full({n}, value).set_requires_grad(true); }

// Loss whose gradient is `scale` times 1, 2, 3 for a, b, c.
at::Tensor loss_of(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, double scale) {
  return ((a * 1).sum() + (b * 2).sum() + (c * 3).sum()) * scale;
}

TEST(GradReducer, BucketsFollowReverseOrderUpToTheSizeAndStartDuringBackward) {
  auto comm = one_process();
  at::Tensor a = param(10, 0), b = param(300, 0), c = param(5, 0);
  // Reverse order: c (20 B) opens a bucket, b (1200 B) does not fit beside it, a does not fit beside b.
  GradReducer reducer(comm, {a, b, c}, /*bucket_bytes=*/1200, /*overlap=*/true);
  EXPECT_EQ(reducer.bucket_count(), 3);
  reducer.arm();
  loss_of(a, b, c, 1.0).backward();
  EXPECT_EQ(reducer.started_in_backward(), 3);
  reducer.finish();
  EXPECT_TRUE(a.grad().equal(at::full({10}, 1.0f)));
  EXPECT_TRUE(b.grad().equal(at::full({300}, 2.0f)));
  EXPECT_TRUE(c.grad().equal(at::full({5}, 3.0f)));
}

TEST(GradReducer, OnlyTheArmedPassCommunicatesAndAccumulatedGradientsAreKept) {
  auto comm = one_process();
  at::Tensor a = param(10, 0), b = param(300, 0), c = param(5, 0);
  GradReducer reducer(comm, {a, b, c}, 1 << 20, /*overlap=*/true);
  EXPECT_EQ(reducer.bucket_count(), 1);
  loss_of(a, b, c, 0.25).backward();  // an earlier micro-batch: accumulate only
  reducer.arm();
  EXPECT_EQ(reducer.started_in_backward(), 0);
  loss_of(a, b, c, 0.75).backward();
  EXPECT_EQ(reducer.started_in_backward(), 1);
  reducer.finish();
  EXPECT_TRUE(a.grad().allclose(at::full({10}, 1.0f)));
  EXPECT_TRUE(c.grad().allclose(at::full({5}, 3.0f)));
  // The next step starts over: nothing has started before the next armed pass.
  a.mutable_grad().zero_();
  b.mutable_grad().zero_();
  c.mutable_grad().zero_();
  loss_of(a, b, c, 1.0).backward();
  EXPECT_EQ(reducer.started_in_backward(), 1);  // the last armed pass's count, unchanged
}

TEST(GradReducer, AParameterWithoutGradientHoldsBackLaterBucketsAndKeepsNone) {
  auto comm = one_process();
  at::Tensor a = param(10, 0), b = param(300, 0), c = param(5, 0), unused = param(7, 0);
  // `unused` comes last, so its bucket is first: no bucket may start before it, so none starts
  // during backward; finish() sends zeros for it and, as no rank gave it a gradient, leaves it
  // without one (the optimizer then leaves it alone, as in one process).
  GradReducer reducer(comm, {a, b, c, unused}, /*bucket_bytes=*/28, /*overlap=*/true);
  reducer.arm();
  loss_of(a, b, c, 1.0).backward();
  EXPECT_EQ(reducer.started_in_backward(), 0);
  reducer.finish();
  EXPECT_FALSE(unused.grad().defined());
  EXPECT_TRUE(b.grad().equal(at::full({300}, 2.0f)));
}

TEST(GradReducer, WithoutOverlapEverythingStartsInFinish) {
  auto comm = one_process();
  at::Tensor a = param(10, 0), b = param(300, 0), c = param(5, 0);
  GradReducer reducer(comm, {a, b, c}, 1200, /*overlap=*/false);
  reducer.arm();
  loss_of(a, b, c, 1.0).backward();
  EXPECT_EQ(reducer.started_in_backward(), 0);
  reducer.finish();
  EXPECT_TRUE(b.grad().equal(at::full({300}, 2.0f)));
}

}  // namespace
}  // namespace loom::dist
