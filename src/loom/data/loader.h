// A deterministic prefetching loader: worker threads build items ahead of the training step,
// and next() hands them out strictly in index order, so a run resumes exactly from position().
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "loom/util/errors.h"

namespace loom::data {

template <typename T>
class PrefetchLoader {
 public:
  // make(i) builds item i; with workers it is called from several threads at once, so it must
  // depend on i alone. num_workers = 0 builds in next(); otherwise up to `prefetch` items past
  // the next one to return are built or in the making.
  PrefetchLoader(std::function<T(int64_t index)> make, int64_t start_index, int num_workers, int prefetch)
      : make_(std::move(make)), position_(start_index), next_to_build_(start_index), prefetch_(prefetch) {
    if (start_index < 0)
      throw ConfigError(fmt::format("loader start index must be >= 0, got {}", start_index));
    if (num_workers < 0) throw ConfigError(fmt::format("data.num_workers must be >= 0, got {}", num_workers));
    if (num_workers > 0 && prefetch < 1) {
      throw ConfigError(
          fmt::format("data.prefetch must be >= 1 when data.num_workers > 0, got {}", prefetch));
    }
    try {
      for (int w = 0; w < num_workers; ++w) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }

  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  // Stops the workers; an item being built is finished and dropped, pending ones are dropped.
  ~PrefetchLoader() { stop(); }

  // Returns item position() and advances. If make threw for that index, the exception is
  // rethrown here and the index counts as consumed.
  T next() {
    const auto start = std::chrono::steady_clock::now();
    if (workers_.empty()) {
      int64_t index;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        index = position_++;
      }
      try {
        T item = make_(index);
        add_wait(start);
        return item;
      } catch (...) {
        add_wait(start);
        throw;
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [this] { return done_.count(position_) > 0; });
    auto node = done_.extract(position_);
    ++position_;
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.unlock();
    space_.notify_all();
    Slot& slot = node.mapped();
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(*slot.value);
  }

  // Index of the next item next() returns: saved in checkpoints, given back as start_index.
  int64_t position() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return position_;
  }

  // Total time next() has spent blocked waiting for items (building them, with no workers).
  double wait_seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return wait_seconds_;
  }

 private:
  struct Slot {
    std::optional<T> value;
    std::exception_ptr error;
  };

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    space_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void add_wait(std::chrono::steady_clock::time_point start) {
    std::lock_guard<std::mutex> lock(mutex_);
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      space_.wait(lock, [this] { return stopping_ || next_to_build_ < position_ + prefetch_; });
      if (stopping_) return;
      const int64_t index = next_to_build_++;
      lock.unlock();
      Slot slot;
      try {
        slot.value.emplace(make_(index));
      } catch (...) {
        slot.error = std::current_exception();
      }
      lock.lock();
      done_.emplace(index, std::move(slot));
      ready_.notify_all();
    }
  }

  std::function<T(int64_t)> make_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;  // an item was finished
  std::condition_variable space_;  // an item was taken, or stop was asked
  std::map<int64_t, Slot> done_;   // finished items not yet returned, by index
  int64_t position_;
  int64_t next_to_build_;
  int64_t prefetch_;
  double wait_seconds_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;  // last: started after every other member exists
};

}  // namespace loom::data
