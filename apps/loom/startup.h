// What the loom process settles before a command runs: the runtimes' environment (OpenMP's wait
// policy, OpenBLAS's kernels for this CPU), the allocator's hold on freed memory, and the thread
// counts of ATen and OpenBLAS.
#pragma once
#include <cstdint>

namespace loom::cli {

// Settings that only take effect when the runtimes load, before main: OpenMP threads that sleep when
// idle (OMP_WAIT_POLICY=PASSIVE; spinning OpenMP threads starve OpenBLAS's on small products) and
// OpenBLAS's kernels for this CPU. When one is missing, Loom sets it and starts itself again; a
// user's own setting is kept.
void ensure_startup_environment(char** argv);

// Freed memory stays in the process instead of going back to the kernel; a user's own MALLOC_*
// settings win.
void keep_freed_memory();

// Keeps OpenBLAS's own thread pool at the thread count ATen uses.
void set_blas_threads(int threads);

// training.threads, or for 0 this process's share of the cores it may run on (the processes
// `loom run` started on this node split them), for ATen and OpenBLAS; at most kThreadsPerCore x
// those cores (more is used as that many, with a warning).
void use_threads(int64_t configured, int64_t local_processes);
constexpr int64_t kThreadsPerCore = 4;

}  // namespace loom::cli
