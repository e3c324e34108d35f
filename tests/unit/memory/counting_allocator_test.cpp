// The counting allocator against byte counts known in advance: the tensors a test allocates, freed
// here or on another thread, and allocations outside a scope left out.
#include "loom/memory/counting_allocator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

namespace loom::memory {
namespace {

TEST(CountingAllocator, CountsLiveBytesAndThePeakSinceItsReset) {
  CountingAllocator& counter = CountingAllocator::install();
  ASSERT_EQ(CountingAllocator::installed(), &counter);
  const CountingAllocator::Scope counted;
  const int64_t start = counter.live_bytes();
  counter.reset_peak();
  at::Tensor a = at::empty({1024}, at::kFloat);
  at::Tensor b = at::empty({512}, at::kDouble);
  EXPECT_EQ(counter.live_bytes() - start, 4096 + 4096);
  a.reset();
  EXPECT_EQ(counter.live_bytes() - start, 4096);
  EXPECT_EQ(counter.peak_bytes() - start, 8192);
  counter.reset_peak();
  EXPECT_EQ(counter.peak_bytes(), counter.live_bytes());
  b.reset();
  EXPECT_EQ(counter.live_bytes(), start);
}

TEST(CountingAllocator, AllocationsOutsideAScopeAreLeftOut) {
  CountingAllocator& counter = CountingAllocator::install();
  const int64_t start = counter.live_bytes();
  at::Tensor outside = at::ones({1000});
  EXPECT_EQ(counter.live_bytes(), start);
  const CountingAllocator::Scope counted;
  outside.reset();  // freed inside a scope, but never counted
  EXPECT_EQ(counter.live_bytes(), start);
}

TEST(CountingAllocator, AFreeOnAnotherThreadIsCounted) {
  CountingAllocator& counter = CountingAllocator::install();
  const CountingAllocator::Scope counted;
  const int64_t start = counter.live_bytes();
  at::Tensor moved = at::zeros({256}, at::kFloat);
  EXPECT_EQ(counter.live_bytes() - start, 1024);
  std::thread([t = std::move(moved)]() mutable { t.reset(); }).join();
  EXPECT_EQ(counter.live_bytes(), start);
}

}  // namespace
}  // namespace loom::memory
