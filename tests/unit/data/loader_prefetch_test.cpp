// PrefetchLoader: strict index order with any number of workers, resume, errors, shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>

#include "loom/data/loader.h"

using loom::data::PrefetchLoader;

namespace {

// A value that depends on the index alone, built with an index-dependent amount of work so that
// workers finish out of order.
std::string build(int64_t index) {
  uint64_t h = static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ULL;
  const int rounds = 1000 + static_cast<int>((h >> 40) % 20000);
  for (int r = 0; r < rounds; ++r) h = h * 6364136223846793005ULL + 1442695040888963407ULL;
  return std::to_string(index) + ":" + std::to_string(h);
}

}  // namespace

TEST(PrefetchLoader, ReturnsTheSynchronousSequenceForAnyWorkerCount) {
  std::vector<std::string> expected;
  for (int64_t i = 0; i < 60; ++i) expected.push_back(build(i));
  for (int workers : {0, 1, 2, 4, 7}) {
    for (int prefetch : {1, 3, 16}) {
      PrefetchLoader<std::string> loader(build, 0, workers, prefetch);
      for (int64_t i = 0; i < 60; ++i) {
        EXPECT_EQ(loader.position(), i);
        EXPECT_EQ(loader.next(), expected[i]) << workers << " workers, prefetch " << prefetch;
      }
      EXPECT_EQ(loader.position(), 60);
    }
  }
}

TEST(PrefetchLoader, NeverBuildsMoreThanPrefetchAhead) {
  for (int prefetch : {1, 2, 5}) {
    std::atomic<int64_t> furthest_ahead{-1000};
    PrefetchLoader<int64_t>* self = nullptr;
    std::atomic<bool> ready{false};
    auto make = [&](int64_t index) {
      while (!ready.load()) std::this_thread::yield();
      // position() only grows, so reading it after this item started is a safe upper bound.
      const int64_t ahead = index - self->position();
      int64_t seen = furthest_ahead.load();
      while (ahead > seen && !furthest_ahead.compare_exchange_weak(seen, ahead)) {
      }
      return index * 3;
    };
    PrefetchLoader<int64_t> loader(make, 5, 4, prefetch);
    self = &loader;
    ready = true;
    for (int64_t i = 5; i < 45; ++i) EXPECT_EQ(loader.next(), i * 3);
    EXPECT_LT(furthest_ahead.load(), prefetch);
  }
}

TEST(PrefetchLoader, ResumesFromASavedPosition) {
  int64_t saved;
  std::vector<std::string> first;
  {
    PrefetchLoader<std::string> loader(build, 0, 3, 4);
    for (int i = 0; i < 13; ++i) first.push_back(loader.next());
    saved = loader.position();
  }
  EXPECT_EQ(saved, 13);
  PrefetchLoader<std::string> resumed(build, saved, 2, 4);
  for (int64_t i = 13; i < 30; ++i) EXPECT_EQ(resumed.next(), build(i));
  PrefetchLoader<std::string> sync(build, saved, 0, 0);
  EXPECT_EQ(sync.next(), build(13));
}

TEST(PrefetchLoader, RethrowsTheErrorOfItsIndexAndGoesOn) {
  auto make = [](int64_t index) -> int64_t {
    if (index == 5) throw std::runtime_error("sample 5 is broken");
    return index;
  };
  for (int workers : {0, 1, 3}) {
    PrefetchLoader<int64_t> loader(make, 0, workers, 4);
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(loader.next(), i);
    try {
      loader.next();
      ADD_FAILURE() << "no exception with " << workers << " workers";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "sample 5 is broken");
    }
    EXPECT_EQ(loader.position(), 6);
    EXPECT_EQ(loader.next(), 6);
  }
}

TEST(PrefetchLoader, ShutsDownCleanlyWithItemsPending) {
  std::atomic<int> made{0};
  auto make = [&](int64_t index) {
    ++made;
    return build(index);
  };
  { PrefetchLoader<std::string> untouched(make, 0, 4, 16); }
  {
    PrefetchLoader<std::string> loader(make, 0, 4, 16);
    EXPECT_EQ(loader.next(), build(0));
  }
  // Each loader builds at most prefetch items past what it returned.
  EXPECT_LE(made.load(), 16 + 17);
}

TEST(PrefetchLoader, HandlesMoveOnlyItems) {
  PrefetchLoader<std::unique_ptr<int64_t>> loader([](int64_t i) { return std::make_unique<int64_t>(i * i); },
                                                  2, 2, 3);
  for (int64_t i = 2; i < 10; ++i) EXPECT_EQ(*loader.next(), i * i);
}

TEST(PrefetchLoader, CountsTimeSpentWaiting) {
  PrefetchLoader<int64_t> loader(
      [](int64_t i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return i;
      },
      0, 0, 0);
  EXPECT_EQ(loader.wait_seconds(), 0.0);
  for (int i = 0; i < 5; ++i) loader.next();
  EXPECT_GE(loader.wait_seconds(), 0.010);  // synchronous: next() waited for every build
}

TEST(PrefetchLoader, RejectsBadSettings) {
  auto identity = [](int64_t i) { return i; };
  EXPECT_THROW(PrefetchLoader<int64_t>(identity, 0, -1, 2), loom::ConfigError);
  EXPECT_THROW(PrefetchLoader<int64_t>(identity, 0, 2, 0), loom::ConfigError);
  EXPECT_THROW(PrefetchLoader<int64_t>(identity, -3, 0, 0), loom::ConfigError);
}
