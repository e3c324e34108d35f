// Context-parallel attention across real processes: this test runs as 4 ranks under `loom run -n 4`
// (tests/e2e/context_parallel.sh); alone it is skipped. Every rank builds the same whole sequence;
// each cp group's ranks shard it, run Ulysses, ring attention or their hybrid, and their outputs
// and summed gradients must be flash attention's over the whole sequence: cp 4 as a ring of 4,
// Ulysses over 4 and 2 x 2, cp 2 as either; packed causal samples with grouped key/value heads
// (Ulysses over 4 replicates the 2 key/value heads), bidirectional windows within frames, and
// single sequences of 1, 127 and 4096 tokens around the ring.
#include <gtest/gtest.h>

#include <map>

#include "../dist/loom_run_world.h"
#include "loom/kernels/attention.h"
#include "loom/nn/attention.h"
#include "loom/parallel/context/shard.h"

namespace loom::nn {
namespace {

// The groups, each formed once per process (their rendezvous names are unique): cp 4 over the
// world, cp 2 over ranks {0, 1} and {2, 3}.
const parallel::ContextParallelGroup& group(int64_t cp, int64_t ulysses) {
  static std::map<std::pair<int64_t, int64_t>, parallel::ContextParallelGroup> groups;
  static std::shared_ptr<dist::Comm> pairs;
  const auto key = std::make_pair(cp, ulysses);
  if (!groups.count(key)) {
    const auto world = dist::loom_run_world();
    if (cp == 2 && !pairs) {
      const int64_t first = world->rank() / 2 * 2;
      pairs = world->subgroup(fmt::format("cp2.{}", first), {first, first + 1});
    }
    groups[key] = parallel::context_parallel_group(cp == 2 ? pairs : world, ulysses);
  }
  return groups.at(key);
}

std::vector<int64_t> cumulative(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu{0};
  for (int64_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

void expect_whole(const parallel::ContextParallelGroup& g, const std::vector<int64_t>& lengths,
                  const std::vector<int64_t>& segments, bool causal, int64_t heads, int64_t kv_heads) {
  const std::string what = fmt::format("cp {} (ulysses {} x ring {}), causal {}, segments [{}]", g.size(),
                                       g.ulysses_size, g.ring_size, causal, fmt::join(segments, ","));
  const int64_t tokens = segments.back(), dim = 16;
  at::manual_seed(17);
  auto q = at::randn({tokens, heads, dim}).requires_grad_(),
       k = at::randn({tokens, kv_heads, dim}).requires_grad_(),
       v = at::randn({tokens, kv_heads, dim}).requires_grad_();
  const at::Tensor dout = at::randn({tokens, heads, dim});
  at::Tensor want = kernels::flash_attention(q, k, v, segments, {causal});
  (want * dout).sum().backward();
  const at::Tensor want_dq = q.grad().clone(), want_dk = k.grad().clone(), want_dv = v.grad().clone();
  q.mutable_grad().reset();
  k.mutable_grad().reset();
  v.mutable_grad().reset();

  const parallel::ContextShard shard = parallel::context_shard(g, lengths, causal);
  const parallel::ContextAttention plan = parallel::context_attention_plan(shard, segments);
  const at::Tensor out = context_attention(shard.scatter(q), shard.scatter(k), shard.scatter(v), plan);
  (out * shard.scatter(dout)).sum().backward();
  const at::NoGradGuard no_grad;
  const at::Tensor real = shard.local_index < tokens;
  EXPECT_TRUE(out.index({real}).allclose(shard.scatter(want).index({real}), 1e-5, 1e-5)) << what << ": out";
  // Each rank's gradients reach only its tokens (and the key/value tokens whose blocks it saw in the
  // ring's backward pass): summed over the group they are the whole gradients.
  std::vector<at::Tensor> grads{q.grad(), k.grad(), v.grad()};
  g.cp->all_reduce_sum(grads);
  EXPECT_TRUE(grads[0].allclose(want_dq, 1e-4, 1e-5)) << what << ": dq";
  EXPECT_TRUE(grads[1].allclose(want_dk, 1e-4, 1e-5)) << what << ": dk";
  EXPECT_TRUE(grads[2].allclose(want_dv, 1e-4, 1e-5)) << what << ": dv";
}

TEST(ContextAttentionUnderLoomRun, UlyssesRingAndHybridAreTheWholeAttention) {
  if (!dist::loom_run_world()) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_nn_tests";
  const std::vector<int64_t> samples{37, 1, 90, 5}, frames{40, 33}, windows{0, 16, 32, 40, 41, 60, 73};
  for (auto [cp, ulysses] :
       std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {4, 4}, {4, 2}, {2, 2}, {2, 1}}) {
    const auto& g = group(cp, ulysses);
    expect_whole(g, samples, cumulative(samples), /*causal=*/true, 4, 2);
    expect_whole(g, frames, windows, /*causal=*/false, 4, 2);
    expect_whole(g, frames, cumulative(frames), /*causal=*/false, 4, 4);
  }
}

// A rows layout (the Wan DiT's [batch, tokens]): every rank holds the same positions of each row, the
// Ulysses exchange runs along the rows.
void expect_rows_whole(const parallel::ContextParallelGroup& g, int64_t rows, int64_t length, bool causal) {
  const std::string what = fmt::format("rows: cp {} (ulysses {} x ring {}), {} rows of {}, causal {}",
                                       g.size(), g.ulysses_size, g.ring_size, rows, length, causal);
  const int64_t tokens = rows * length, heads = 4, dim = 8;
  at::manual_seed(23);
  auto q = at::randn({tokens, heads, dim}).requires_grad_(),
       k = at::randn({tokens, heads, dim}).requires_grad_(),
       v = at::randn({tokens, heads, dim}).requires_grad_();
  const at::Tensor dout = at::randn({tokens, heads, dim});
  std::vector<int64_t> cu;
  for (int64_t r = 0; r <= rows; ++r) cu.push_back(r * length);
  at::Tensor want = kernels::flash_attention(q, k, v, cu, {causal});
  (want * dout).sum().backward();
  const at::Tensor want_dq = q.grad().clone(), want_dk = k.grad().clone(), want_dv = v.grad().clone();
  q.mutable_grad().reset();
  k.mutable_grad().reset();
  v.mutable_grad().reset();
  const parallel::ContextShard shard = parallel::context_row_shard(g, rows, length, causal);
  auto local = [&](const at::Tensor& x) {
    return shard.scatter_rows(x.view({rows, length, -1, dim})).flatten(0, 1);
  };
  const at::Tensor out =
      context_attention(local(q), local(k), local(v), parallel::context_attention_plan(shard, cu));
  (out * local(dout)).sum().backward();
  const at::NoGradGuard no_grad;
  const at::Tensor real = (shard.row_index < length).repeat({rows});
  EXPECT_TRUE(out.index({real}).allclose(local(want).index({real}), 1e-5, 1e-5)) << what << ": out";
  std::vector<at::Tensor> grads{q.grad(), k.grad(), v.grad()};
  g.cp->all_reduce_sum(grads);
  EXPECT_TRUE(grads[0].allclose(want_dq, 1e-4, 1e-5)) << what << ": dq";
  EXPECT_TRUE(grads[1].allclose(want_dk, 1e-4, 1e-5)) << what << ": dk";
  EXPECT_TRUE(grads[2].allclose(want_dv, 1e-4, 1e-5)) << what << ": dv";
}

TEST(ContextAttentionUnderLoomRun, RowsLayoutsAreTheWholeAttention) {
  if (!dist::loom_run_world()) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_nn_tests";
  for (auto [cp, ulysses] : std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {4, 4}, {4, 2}, {2, 2}, {2, 1}})
    for (bool causal : {false, true}) expect_rows_whole(group(cp, ulysses), 3, 37, causal);
}

TEST(ContextAttentionUnderLoomRun, RingOfFourOnSequencesOf1And127And4096Tokens) {
  if (!dist::loom_run_world()) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_nn_tests";
  for (int64_t tokens : {1, 127, 4096})
    for (bool causal : {true, false}) expect_whole(group(4, 1), {tokens}, {0, tokens}, causal, 2, 1);
}

}  // namespace
}  // namespace loom::nn
