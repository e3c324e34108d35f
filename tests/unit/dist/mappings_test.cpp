// The autograd-aware collectives across real processes: this test runs as 4 ranks under
// `loom run -n 4` (tests/e2e/parallel_state.sh); alone it is skipped. Rank r's input and the
// gradient it feeds back are built from r, so each mapping's forward output and the gradient that
// reaches its input have closed forms.
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

TEST(Mappings, OneRankIsTheIdentity) {
  auto x = at::ones({2, 2}).set_requires_grad(true);
  for (const auto& y : {copy_to_region(x, nullptr), reduce_from_region(x, nullptr),
                        scatter_to_region(x, nullptr, 0), gather_from_sequence_region(x, nullptr, 1)})
    EXPECT_TRUE(y.is_same(x));
}

}  // namespace
}  // namespace loom::dist
