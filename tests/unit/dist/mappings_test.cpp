// The autograd-aware collectives across real processes: this test runs as 4 ranks under
// `loom run -n 4` (tests/e2e/parallel_state.sh); alone it is skipped. Rank r's input and the
// gradient it feeds back are built from r, so each mapping's forward output and the gradient that
// reaches its input have closed forms (the all-to-alls' too: unequal splits and Ulysses' reshard).
#include "loom/dist/mappings.h"

#include <c10/util/accumulate.h>
#include <gtest/gtest.h>

#include "loom_run_world.h"

namespace loom::dist {
namespace {

constexpr int64_t kRanks = 4;

// x = (r + 1) * [[1, 2, ...]] of the given shape, needing a gradient.
at::Tensor input_of(int64_t rank, at::IntArrayRef shape) {
  return (at::arange(c10::multiply_integers(shape), at::kFloat) + 1)
      .mul(static_cast<double>(rank + 1))
      .view(shape)
      .set_requires_grad(true);
}

// Backpropagates g = (r + 1) * 10 + [0, 1, ...] (y's shape) through y; returns x's gradient.
at::Tensor backward_of(const at::Tensor& x, const at::Tensor& y, int64_t rank) {
  const auto g = at::arange(y.numel(), at::kFloat).view(y.sizes()) + 10.0 * (rank + 1);
  y.backward(g);
  return x.grad();
}

at::Tensor upstream(const at::IntArrayRef shape, int64_t rank) {
  return at::arange(c10::multiply_integers(shape), at::kFloat).view(shape) + 10.0 * (rank + 1);
}

TEST(MappingsUnderLoomRun, ForwardAndBackwardHaveTheirClosedForms) {
  const auto comm = loom_run_world();
  if (!comm) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_dist_tests";
  const int64_t r = comm->rank();
  const double sum_r1 = 1 + 2 + 3 + 4;  // sum over ranks of (r + 1)

  {  // copy: identity forward; backward sums the ranks' gradients.
    auto x = input_of(r, {2, 3});
    auto y = copy_to_region(x, comm);
    EXPECT_TRUE(y.equal(x.detach()));
    auto expected = at::zeros({2, 3});
    for (int64_t k = 0; k < kRanks; ++k) expected += upstream({2, 3}, k);
    EXPECT_TRUE(backward_of(x, y, r).equal(expected));
  }
  {  // reduce: sum forward; identity backward.
    auto x = input_of(r, {2, 3});
    auto y = reduce_from_region(x, comm);
    EXPECT_TRUE(y.equal(input_of(0, {2, 3}).detach() * sum_r1));
    EXPECT_TRUE(backward_of(x, y, r).equal(upstream({2, 3}, r)));
  }
  {  // sum over the region: sum forward; backward sums the ranks' gradients too.
    auto x = input_of(r, {2, 3});
    auto y = sum_over_region(x, comm);
    EXPECT_TRUE(y.equal(input_of(0, {2, 3}).detach() * sum_r1));
    auto expected = at::zeros({2, 3});
    for (int64_t k = 0; k < kRanks; ++k) expected += upstream({2, 3}, k);
    EXPECT_TRUE(backward_of(x, y, r).equal(expected));
  }
  {  // scatter along the last dimension: this rank's chunk; backward gathers the chunks' gradients.
    auto x = input_of(0, {2, 8});
    auto y = scatter_to_region(x, comm, -1);
    EXPECT_TRUE(y.equal(x.detach().narrow(1, 2 * r, 2)));
    std::vector<at::Tensor> chunks;
    for (int64_t k = 0; k < kRanks; ++k) chunks.push_back(upstream({2, 2}, k));
    EXPECT_TRUE(backward_of(x, y, r).equal(at::cat(chunks, 1)));
  }
  {  // gather along dimension 0: rank order; backward keeps this rank's chunk.
    auto x = input_of(r, {1, 3});
    auto y = gather_from_region(x, comm, 0);
    std::vector<at::Tensor> pieces;
    for (int64_t k = 0; k < kRanks; ++k) pieces.push_back(input_of(k, {1, 3}).detach());
    EXPECT_TRUE(y.equal(at::cat(pieces, 0)));
    EXPECT_TRUE(backward_of(x, y, r).equal(upstream({4, 3}, r).narrow(0, r, 1)));
  }
  {  // sequence gather along dimension 1: rank order; backward sums and keeps this rank's chunk.
    auto x = input_of(r, {2, 1, 2});
    auto y = gather_from_sequence_region(x, comm, 1);
    std::vector<at::Tensor> pieces;
    for (int64_t k = 0; k < kRanks; ++k) pieces.push_back(input_of(k, {2, 1, 2}).detach());
    EXPECT_TRUE(y.equal(at::cat(pieces, 1)));
    auto total = at::zeros({2, 4, 2});
    for (int64_t k = 0; k < kRanks; ++k) total += upstream({2, 4, 2}, k);
    EXPECT_TRUE(backward_of(x, y, r).equal(total.narrow(1, r, 1)));
  }
  {  // sequence reduce-scatter along dimension 0: this rank's chunk of the sum; backward gathers.
    auto x = input_of(r, {8, 2});
    auto y = reduce_scatter_to_sequence_region(x, comm, 0);
    EXPECT_TRUE(y.equal((input_of(0, {8, 2}).detach() * sum_r1).narrow(0, 2 * r, 2)));
    std::vector<at::Tensor> chunks;
    for (int64_t k = 0; k < kRanks; ++k) chunks.push_back(upstream({2, 2}, k));
    EXPECT_TRUE(backward_of(x, y, r).equal(at::cat(chunks, 0)));
  }
  {  // bf16 reduce-scatter (summed in fp32; small integers are exact) and all-gather.
    auto x = at::full({4, 2}, static_cast<double>(r + 1), at::kBFloat16);
    EXPECT_TRUE(reduce_scatter_along(x, *comm, 0).equal(at::full({1, 2}, sum_r1, at::kBFloat16)));
    EXPECT_TRUE(all_gather_along(x.narrow(0, 0, 1), *comm, 1)
                    .equal(at::arange(1, 5, at::kFloat).repeat_interleave(2).view({1, 8}).to(at::kBFloat16)));
  }
  {  // A chunk count the group does not divide is an error naming the shape.
    try {
      scatter_to_region(input_of(r, {2, 3}), comm, 1);
      ADD_FAILURE() << "expected a DistributedError";
    } catch (const std::exception& e) {
      EXPECT_NE(
          std::string(e.what()).find("dimension 1 of a [2, 3] tensor does not split into 4 equal chunks"),
          std::string::npos)
          << e.what();
    }
  }
  comm->barrier();
}

// The all-to-all mappings. Unequal splits: rank r sends j + 1 rows to rank j, row k of them
// 100 * r + 10 * j + k; the gradient of sum(w * y), w on rank q being 1000 * q + 10 * row + column,
// takes each row's weight back to where the row came from. Ulysses' reshard (b, s/4, h, d) ->
// (b, s, h/4, d) and back is the identity, and so is its gradient.
TEST(MappingsUnderLoomRun, AllToAllsForwardAndBackwardHaveTheirClosedForms) {
  const auto comm = loom_run_world();
  if (!comm) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_dist_tests";
  const int64_t r = comm->rank();
  // (rows, 2): 1000 * q + 10 * row + column
  auto weights = [](int64_t q, int64_t rows) {
    return at::arange(rows, at::kFloat).mul(10).view({rows, 1}) + at::arange(2, at::kFloat).view({1, 2}) +
           1000.0 * static_cast<double>(q);
  };
  {
    std::vector<at::Tensor> blocks;
    for (int64_t j = 0; j < kRanks; ++j)
      blocks.push_back(
          (at::arange(j + 1, at::kFloat).view({j + 1, 1}) + 100.0 * r + 10.0 * j).expand({j + 1, 2}));
    const auto x = at::cat(blocks).set_requires_grad(true);
    const auto y = all_to_all(x, comm, std::vector<int64_t>(kRanks, r + 1), {1, 2, 3, 4});
    // r + 1 rows from every rank i, in rank order: 100 * i + 10 * r + k.
    std::vector<at::Tensor> expected;
    for (int64_t i = 0; i < kRanks; ++i)
      expected.push_back(
          (at::arange(r + 1, at::kFloat).view({r + 1, 1}) + 100.0 * i + 10.0 * r).expand({r + 1, 2}));
    EXPECT_TRUE(y.equal(at::cat(expected)));
    (y * weights(r, kRanks * (r + 1))).sum().backward();
    // Row k of the block x sent to rank j sits at row r * (j + 1) + k of j's output.
    std::vector<at::Tensor> gradient;
    for (int64_t j = 0; j < kRanks; ++j)
      gradient.push_back(weights(j, kRanks * (j + 1)).narrow(0, r * (j + 1), j + 1));
    EXPECT_TRUE(x.grad().equal(at::cat(gradient)));
  }
  {  // Ulysses: x_q = q * 1000 + [0, 1, ...] of (b 2, s/4 3, h 8, d 2).
    auto x_of = [](int64_t q) { return at::arange(96, at::kFloat).view({2, 3, 8, 2}) + 1000.0 * q; };
    const auto x = x_of(r).set_requires_grad(true);
    const auto y = all_to_all_reshard(x, comm, -2, 1);  // heads scattered, sequence gathered
    // The whole sequence (rank q's part at 3q) of this rank's two heads.
    std::vector<at::Tensor> sequence;
    for (int64_t q = 0; q < kRanks; ++q) sequence.push_back(x_of(q).narrow(2, 2 * r, 2));
    EXPECT_TRUE(y.equal(at::cat(sequence, 1)));
    const auto back = all_to_all_reshard(y, comm, 1, 2);
    EXPECT_TRUE(back.equal(x.detach()));
    // Through y alone: head h's gradient comes from rank h / 2's weights at this rank's positions.
    auto w_of = [](int64_t q) { return at::arange(96, at::kFloat).view({2, 12, 2, 2}) * 2 + 1000.0 * q; };
    (y * w_of(r)).sum().backward();
    std::vector<at::Tensor> heads;
    for (int64_t q = 0; q < kRanks; ++q) heads.push_back(w_of(q).narrow(1, 3 * r, 3));
    EXPECT_TRUE(x.grad().equal(at::cat(heads, 2)));
    // Through the round trip: the identity, so the gradient is the weight itself.
    const auto x2 = x_of(r).set_requires_grad(true);
    const auto w = at::arange(96, at::kFloat).view({2, 3, 8, 2}) * 3 - 7.0 * r;
    (all_to_all_reshard(all_to_all_reshard(x2, comm, 2, 1), comm, 1, 2) * w).sum().backward();
    EXPECT_TRUE(x2.grad().equal(w));
  }
  {  // Heads the group does not divide are an error naming the shape.
    try {
      all_to_all_reshard(at::zeros({2, 3, 6, 2}), comm, 2, 1);
      ADD_FAILURE() << "expected a DistributedError";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "dimension 2 of a [2, 3, 6, 2] tensor does not split into 4 equal chunks"),
                std::string::npos)
          << e.what();
    }
  }
  comm->barrier();
}

TEST(Mappings, OneRankIsTheIdentity) {
  auto x = at::ones({2, 2}).set_requires_grad(true);
  for (const auto& y :
       {copy_to_region(x, nullptr), reduce_from_region(x, nullptr), sum_over_region(x, nullptr),
        scatter_to_region(x, nullptr, 0), gather_from_sequence_region(x, nullptr, 1),
        all_to_all(x, nullptr, {2}, {2}), all_to_all_reshard(x, nullptr, 0, 1)})
    EXPECT_TRUE(y.is_same(x));
}

}  // namespace
}  // namespace loom::dist
