// Context parallelism's layout, in one process: every rank's slots together hold each token once
// (causal sequences in zig-zag chunks, bidirectional ones in order, padding where the chunks do not
// divide them), and the attention each ring rank runs over its blocks, merged by log-sum-exp and
// differentiated block by block, is the whole sequence's flash attention, for packed causal samples
// and for bidirectional frames cut into windows.
#include <gtest/gtest.h>

#include "loom/parallel/context/shard.h"
#include "loom/util/errors.h"

namespace loom::parallel {
namespace {

ContextParallelGroup simulated(int64_t ulysses, int64_t ring, int64_t cp_rank) {
  ContextParallelGroup g;
  g.ulysses_size = ulysses;
  g.ring_size = ring;
  g.ulysses_rank = cp_rank % ulysses;
  g.ring_rank = cp_rank / ulysses;
  return g;
}

std::vector<int64_t> cumulative(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu{0};
  for (int64_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

std::vector<ContextShard> every_rank(int64_t ulysses, int64_t ring, const std::vector<int64_t>& lengths,
                                     bool causal, int64_t align = 1) {
  std::vector<ContextShard> shards;
  for (int64_t c = 0; c < ulysses * ring; ++c)
    shards.push_back(context_shard(simulated(ulysses, ring, c), lengths, causal, align));
  return shards;
}

TEST(ContextShard, EveryTokenOnceInZigZagOrInOrder) {
  const std::vector<int64_t> lengths{37, 0, 1, 90};
  for (bool causal : {true, false})
    for (auto [ulysses, ring] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 4}, {4, 1}, {2, 2}, {1, 2}, {2, 1}}) {
      const auto shards = every_rank(ulysses, ring, lengths, causal, /*align=*/2);
      std::vector<at::Tensor> slots;
      for (const auto& s : shards) {
        EXPECT_EQ(s.local_length % 2, 0);
        EXPECT_EQ(s.local_length, shards[0].local_length);
        slots.push_back(s.local_index);
      }
      const at::Tensor all = at::cat(slots);
      const at::Tensor real = all.masked_select(all < 128);
      EXPECT_TRUE(std::get<0>(at::sort(real)).equal(at::arange(128, at::kLong)))
          << "causal " << causal << " ulysses " << ulysses << " ring " << ring;
      EXPECT_TRUE(all.index_select(0, shards[0].restore).equal(at::arange(128, at::kLong)));
    }
  // Zig-zag: a causal sequence of 16 tokens over a ring of 2 is chunks of 4; ring rank 0 holds
  // chunks 0 and 3, rank 1 chunks 1 and 2. In order for bidirectional attention.
  auto zig = every_rank(1, 2, {16}, true);
  EXPECT_TRUE(zig[0].local_index.equal(at::tensor({0, 1, 2, 3, 12, 13, 14, 15}, at::kLong)));
  EXPECT_TRUE(zig[1].local_index.equal(at::tensor({4, 5, 6, 7, 8, 9, 10, 11}, at::kLong)));
  auto in_order = every_rank(1, 2, {6}, false);
  EXPECT_TRUE(in_order[1].local_index.equal(at::tensor({3, 4, 5}, at::kLong)));
  // 5 causal tokens over a ring of 2: chunks of 2 (3 padding slots, index 5), 4 slots per rank.
  auto padded = every_rank(1, 2, {5}, true);
  EXPECT_TRUE(padded[0].local_index.equal(at::tensor({0, 1, 5, 5}, at::kLong)));
  EXPECT_TRUE(padded[1].local_index.equal(at::tensor({2, 3, 4, 5}, at::kLong)));
}

at::Tensor rows(const at::Tensor& x, const at::Tensor& index) {
  return at::cat({x, at::zeros({1, x.size(1), x.size(2)})}).index_select(0, index);
}

// Runs every ring rank's attention from its blocks in one process (the Ulysses slots of a ring rank
// together are its ring shard) and compares with flash attention over the whole axis.
void expect_ring_is_whole(int64_t ulysses, int64_t ring, const std::vector<int64_t>& lengths,
                          const std::vector<int64_t>& segments, bool causal) {
  const std::string what = fmt::format("ulysses {} ring {} causal {} segments [{}]", ulysses, ring, causal,
                                       fmt::join(segments, ","));
  const int64_t tokens = segments.back();
  at::manual_seed(3);
  auto q = at::randn({tokens, 4, 8}).requires_grad_(), k = at::randn({tokens, 2, 8}).requires_grad_(),
       v = at::randn({tokens, 2, 8}).requires_grad_();
  const auto dout = at::randn({tokens, 4, 8});
  const at::Tensor want = kernels::flash_attention(q, k, v, segments, {causal});
  (want * dout).sum().backward();
  const at::NoGradGuard no_grad;
  const auto shards = every_rank(ulysses, ring, lengths, causal);
  std::vector<at::Tensor> index(static_cast<size_t>(ring));
  std::vector<ContextAttention> plans;
  for (int64_t r = 0; r < ring; ++r) {
    std::vector<at::Tensor> slots;
    for (int64_t u = 0; u < ulysses; ++u)
      slots.push_back(shards[static_cast<size_t>(r * ulysses + u)].local_index);
    index[static_cast<size_t>(r)] = at::cat(slots);
    plans.push_back(context_attention_plan(shards[static_cast<size_t>(r * ulysses)], segments));
  }
  auto at_rank = [&](const at::Tensor& x, int64_t r) { return rows(x, index[static_cast<size_t>(r)]); };
  at::Tensor dq = at::zeros({tokens + 1, 4, 8}), dk = at::zeros({tokens + 1, 2, 8}),
             dv = at::zeros({tokens + 1, 2, 8});
  for (int64_t r = 0; r < ring; ++r) {
    const auto& plan = plans[static_cast<size_t>(r)];
    const at::Tensor real = index[static_cast<size_t>(r)] < tokens;
    std::vector<kernels::AttentionBlock> own_blocks =
        ring == 1 ? kernels::segment_blocks(plan.cu_seqlens) : plan.blocks[static_cast<size_t>(r)];
    at::Tensor out, lse;
    for (int64_t s = 0; s < ring; ++s) {
      const auto& blocks = ring == 1 ? own_blocks : plan.blocks[static_cast<size_t>(s)];
      auto part =
          kernels::attention_forward(at_rank(q, r), at_rank(k, s), at_rank(v, s), blocks, {causal && s == r});
      if (!out.defined()) {
        out = part.out;
        lse = part.lse;
        continue;
      }
      const auto merged = at::logaddexp(lse, part.lse);
      auto w = [&](const at::Tensor& l) {
        return at::exp(l - merged).nan_to_num(0.0).transpose(0, 1).unsqueeze(-1);
      };
      out = out * w(lse) + part.out * w(part.lse);
      lse = merged;
    }
    const at::Tensor expected = rows(want.detach(), index[static_cast<size_t>(r)]);
    EXPECT_TRUE(out.index({real}).allclose(expected.index({real}), 1e-5, 1e-5))
        << what << ": out of ring rank " << r;
    const at::Tensor grad = rows(dout, index[static_cast<size_t>(r)]);
    for (int64_t s = 0; s < ring; ++s) {
      const auto& blocks = ring == 1 ? own_blocks : plan.blocks[static_cast<size_t>(s)];
      auto g = kernels::attention_backward(grad, at_rank(q, r), at_rank(k, s), at_rank(v, s), out, lse,
                                           blocks, {causal && s == r});
      dq.index_add_(0, index[static_cast<size_t>(r)], g.dq);
      dk.index_add_(0, index[static_cast<size_t>(s)], g.dk);
      dv.index_add_(0, index[static_cast<size_t>(s)], g.dv);
    }
  }
  EXPECT_TRUE(dq.narrow(0, 0, tokens).allclose(q.grad(), 1e-4, 1e-5)) << what << ": dq";
  EXPECT_TRUE(dk.narrow(0, 0, tokens).allclose(k.grad(), 1e-4, 1e-5)) << what << ": dk";
  EXPECT_TRUE(dv.narrow(0, 0, tokens).allclose(v.grad(), 1e-4, 1e-5)) << what << ": dv";
}

TEST(ContextShard, RingBlocksOfPackedCausalSamplesAreTheWholeAttention) {
  const std::vector<int64_t> lengths{37, 1, 90, 5};
  for (auto [ulysses, ring] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 4}, {2, 2}, {1, 2}, {4, 1}, {1, 3}})
    expect_ring_is_whole(ulysses, ring, lengths, cumulative(lengths), true);
}

TEST(ContextShard, RingBlocksOfWindowsWithinFramesAreTheWholeAttention) {
  const std::vector<int64_t> frames{40, 33};
  const std::vector<int64_t> windows{0, 16, 32, 40, 41, 60, 73};  // windows never cross a frame
  for (auto [ulysses, ring] : std::vector<std::pair<int64_t, int64_t>>{{1, 4}, {2, 2}, {4, 1}, {1, 3}}) {
    expect_ring_is_whole(ulysses, ring, frames, windows, false);
    expect_ring_is_whole(ulysses, ring, frames, cumulative(frames), false);
  }
}

TEST(ContextShard, SegmentsThatDoNotFitTheLayoutAreModelErrors) {
  const auto shard = context_shard(simulated(1, 2, 0), {10, 10}, false);
  EXPECT_THROW(context_attention_plan(shard, {0, 5, 15, 20}), ModelError);  // crosses a frame
  EXPECT_THROW(context_attention_plan(shard, {0, 10}), ModelError);         // not the axis's tokens
  const auto causal = context_shard(simulated(1, 2, 0), {10, 10}, true);
  EXPECT_THROW(context_attention_plan(causal, {0, 5, 10, 20}), ModelError);  // not the sequences
  EXPECT_THROW(context_parallel_group(nullptr, 2), ConfigError);
}

}  // namespace
}  // namespace loom::parallel
