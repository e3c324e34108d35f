#include "loom/memory/counting_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "loom/util/errors.h"

namespace loom::memory {
namespace {

thread_local bool counting = false;
std::atomic<CountingAllocator*> the_allocator{nullptr};
c10::Allocator* underlying = nullptr;           // set once, before the first allocation
c10::DeleterFnPtr underlying_delete = nullptr;  // its plain pointers' deleter

// The sizes of the counted blocks still allocated, by address.
std::mutex counted_mutex;
std::unordered_map<void*, int64_t>& counted_blocks() {
  static auto* blocks = new std::unordered_map<void*, int64_t>();  // outlives every tensor
  return *blocks;
}

}  // namespace

CountingAllocator& CountingAllocator::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    underlying = c10::GetCPUAllocator();
    underlying_delete = underlying->raw_deleter();
    if (!underlying_delete)
      throw Error(
          "memory: libtorch's CPU allocator hands out no plain pointers; allocations cannot be counted");
    auto* allocator = new CountingAllocator();  // lives as long as the process
    c10::SetCPUAllocator(allocator, /*priority=*/UINT8_MAX);
    if (c10::GetCPUAllocator() != allocator)
      throw Error("memory: libtorch kept its CPU allocator; allocations cannot be counted");
    the_allocator.store(allocator);
  });
  return *the_allocator.load();
}

CountingAllocator* CountingAllocator::installed() { return the_allocator.load(); }

CountingAllocator::Scope::Scope() : previous_(counting) { counting = true; }
CountingAllocator::Scope::~Scope() { counting = previous_; }
bool CountingAllocator::counts_this_thread() { return counting; }

c10::DataPtr CountingAllocator::allocate(size_t bytes) {
  void* data = underlying->raw_allocate(bytes);
  if (counting && data) {
    const auto size = static_cast<int64_t>(bytes);
    {
      std::lock_guard<std::mutex> lock(counted_mutex);
      counted_blocks()[data] = size;
    }
    const int64_t live = live_.fetch_add(size) + size;
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
  }
  return {data, data, &CountingAllocator::release, c10::Device(c10::DeviceType::CPU)};
}

void CountingAllocator::copy_data(void* dest, const void* src, size_t count) const {
  std::memcpy(dest, src, count);
}

c10::DeleterFnPtr CountingAllocator::raw_deleter() const { return &CountingAllocator::release; }

void CountingAllocator::release(void* data) {
  if (!data) return;
  int64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(counted_mutex);
    auto& blocks = counted_blocks();
    if (const auto it = blocks.find(data); it != blocks.end()) {
      size = it->second;
      blocks.erase(it);
    }
  }
  if (size > 0) the_allocator.load()->live_.fetch_sub(size);
  underlying_delete(data);
}

}  // namespace loom::memory
