// What the loom process settles before a command runs: the runtime's environment (OpenMP's wait
// policy), the allocator's hold on freed memory, and ATen's thread count.
#pragma once
#include <cstdint>

namespace loom::cli {

// Settings that only take effect when the runtime loads, before main: OpenMP threads that sleep when
// idle (OMP_WAIT_POLICY=PASSIVE: spinning OpenMP threads starve the other threads of a 2-core
// machine, the data loader's and the collectives'). When it is missing, Loom sets it and starts
// itself again; a user's own setting is kept.
void ensure_startup_environment(char** argv);

// Freed memory stays in the process instead of going back to the kernel; a user's own MALLOC_*
// settings win.
void keep_freed_memory();

// training.threads, or for 0 this process's share of the cores it may run on (the processes
// `loom run` started on this node split them), for ATen (and the BLAS it runs on); at most kThreadsPerCore x
// those cores (more is used as that many, with a warning).
void use_threads(int64_t configured, int64_t local_processes);
constexpr int64_t kThreadsPerCore = 4;

}  // namespace loom::cli
