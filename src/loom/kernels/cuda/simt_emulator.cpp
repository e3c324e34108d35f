// The CPU emulator of simt.h: a block's threads are ucontext fibers on the launching thread. A
// fiber runs until it reaches a barrier (sync_threads, or the warp-wide exchange inside a shuffle)
// or ends; the scheduler then resumes the next fiber that can go on. A barrier opens when every
// live thread of its scope has arrived; threads that have returned no longer count, as on a GPU.
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/kernels/cuda/simt.h"

namespace LOOM_CUDA_NAMESPACE::simt {
namespace emulator {

const Thread* current = nullptr;

namespace {

constexpr size_t kStackBytes = 256 * 1024;

enum class Wait { kNone, kBlock, kWarp };

struct Fiber {
  Thread thread;
  ucontext_t context{};
  char* stack = nullptr;
  Wait wait = Wait::kNone;
  bool done = false;
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler{};
  const std::function<void()>* body = nullptr;
  Fiber* running = nullptr;
  int live = 0;
  int at_block_barrier = 0;
  std::vector<int> live_in_warp, at_warp_barrier;
  std::vector<float> lanes;         // one shuffle slot per thread (warp_all_gather's: a few per thread)
  unsigned char* shared = nullptr;  // dynamic shared memory
  std::exception_ptr error;
};

Block* block = nullptr;
std::mutex launch_mutex;
// Fiber stacks, kept from launch to launch (uninitialised memory: a stack needs none) and grown to
// the largest block so far; used under launch_mutex.
std::vector<std::unique_ptr<char[]>> stacks;

void yield() { swapcontext(&block->running->context, &block->scheduler); }

// Opens the block barrier, or warp w's, when everyone live there has arrived.
void open_barriers(int warp) {
  Block& b = *block;
  if (b.at_block_barrier > 0 && b.at_block_barrier == b.live) {
    for (Fiber& f : b.fibers)
      if (f.wait == Wait::kBlock) f.wait = Wait::kNone;
    b.at_block_barrier = 0;
  }
  if (b.at_warp_barrier[warp] > 0 && b.at_warp_barrier[warp] == b.live_in_warp[warp]) {
    for (int t = warp * kWarp; t < (warp + 1) * kWarp; ++t)
      if (b.fibers[t].wait == Wait::kWarp) b.fibers[t].wait = Wait::kNone;
    b.at_warp_barrier[warp] = 0;
  }
}

void wait_at(Wait scope) {
  Block& b = *block;
  Fiber& self = *b.running;
  const int warp = self.thread.id / kWarp;
  self.wait = scope;
  ++(scope == Wait::kBlock ? b.at_block_barrier : b.at_warp_barrier[warp]);
  open_barriers(warp);
  while (self.wait != Wait::kNone) yield();
}

void run_fiber() {
  Block& b = *block;
  Fiber& self = *b.running;
  try {
    (*b.body)();
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  self.done = true;
  --b.live;
  --b.live_in_warp[self.thread.id / kWarp];
  open_barriers(self.thread.id / kWarp);
  // Returning resumes the scheduler (uc_link).
}

}  // namespace

void sync_threads() { wait_at(Wait::kBlock); }

void sync_warp() { wait_at(Wait::kWarp); }

unsigned char* dynamic_shared() { return block->shared; }

void warp_all_gather(const float* mine, int count, float* all) {
  Block& b = *block;
  const int id = b.running->thread.id, warp = id / kWarp;
  if (b.lanes.size() < b.fibers.size() * count) b.lanes.resize(b.fibers.size() * count);
  std::copy(mine, mine + count, b.lanes.begin() + static_cast<std::ptrdiff_t>(id) * count);
  wait_at(Wait::kWarp);  // every lane has written
  if (b.live_in_warp[warp] != kWarp)
    throw std::logic_error("simt emulator: a warp-wide matrix operation in warp " + std::to_string(warp) +
                           " after some of its lanes returned");
  const auto first = b.lanes.begin() + static_cast<std::ptrdiff_t>(warp) * kWarp * count;
  std::copy(first, first + kWarp * count, all);
  wait_at(Wait::kWarp);  // every lane has read before the next exchange writes
}

float shuffle_xor(float value, int lane_mask) {
  Block& b = *block;
  const int id = b.running->thread.id, partner = id ^ lane_mask;
  b.lanes[id] = value;
  wait_at(Wait::kWarp);  // every lane has written
  const float result = b.lanes[partner];
  wait_at(Wait::kWarp);  // every lane has read before the next exchange writes
  return result;
}

}  // namespace emulator

void emulate(Dim grid, int block_threads, const std::function<void()>& body, size_t shared_bytes) {
  using namespace emulator;
  if (block_threads <= 0 || block_threads % kWarp != 0)
    throw std::logic_error("simt emulator: a block of " + std::to_string(block_threads) +
                           " threads is not a whole number of warps");
  const std::lock_guard<std::mutex> lock(launch_mutex);
  Block b;
  b.body = &body;
  b.fibers.resize(block_threads);
  while (stacks.size() < static_cast<size_t>(block_threads))
    stacks.push_back(std::unique_ptr<char[]>(new char[kStackBytes]));
  for (int t = 0; t < block_threads; ++t) b.fibers[t].stack = stacks[t].get();
  const int warps = block_threads / kWarp;
  b.lanes.assign(block_threads, 0.0F);
  // 128-byte aligned, as CUDA's dynamic shared memory.
  std::vector<unsigned char> shared(shared_bytes + 128);
  b.shared = shared.data() + (128 - reinterpret_cast<uintptr_t>(shared.data()) % 128) % 128;
  block = &b;
  struct Reset {
    ~Reset() {
      block = nullptr;
      current = nullptr;
    }
  } reset;

  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        b.live = block_threads;
        b.at_block_barrier = 0;
        b.live_in_warp.assign(warps, kWarp);
        b.at_warp_barrier.assign(warps, 0);
        std::fill(b.shared, b.shared + shared_bytes, 0xff);
        for (int t = 0; t < block_threads; ++t) {
          Fiber& f = b.fibers[t];
          f.thread = {t, block_threads, {x, y, z}, grid};
          f.wait = Wait::kNone;
          f.done = false;
          getcontext(&f.context);
          f.context.uc_stack.ss_sp = f.stack;
          f.context.uc_stack.ss_size = kStackBytes;
          f.context.uc_link = &b.scheduler;
          makecontext(&f.context, run_fiber, 0);
        }
        // Passes alternate between ascending and descending thread order, so that reads of shared
        // memory a missing barrier leaves unordered see stale values for some thread orders (the
        // test AMissingBarrierShowsAsAStaleRead); this catches many such races, not all.
        for (int pass = 0; b.live > 0; ++pass) {
          bool progressed = false;
          for (int i = 0; i < block_threads; ++i) {
            Fiber& f = b.fibers[pass % 2 == 0 ? i : block_threads - 1 - i];
            if (f.done || f.wait != Wait::kNone) continue;
            b.running = &f;
            current = &f.thread;
            swapcontext(&b.scheduler, &f.context);
            progressed = true;
          }
          if (!progressed)
            throw std::logic_error("simt emulator: block (" + std::to_string(x) + ", " + std::to_string(y) +
                                   ", " + std::to_string(z) +
                                   ") deadlocked: its waiting threads can never all be released");
        }
        if (b.error) std::rethrow_exception(b.error);
      }
}

}  // namespace LOOM_CUDA_NAMESPACE::simt
