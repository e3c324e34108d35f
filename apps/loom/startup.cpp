#include "startup.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

namespace loom::cli {

namespace {

// OpenBLAS picks its kernels from the CPU model when it loads. On a CPU it does not recognise (the
// 2-core machine reports a generic "Intel(R) Xeon(R) Processor") it falls back to Prescott's SSE3
// kernels, although the CPU has AVX-512: sgemm ran at 63 GFLOP/s instead of 306 and a training
// step took 1.7x longer. The core type that matches the instruction set, or nothing to change.
std::string openblas_core_for_this_cpu() {
  using CoreName = char* (*)();
  const auto name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!name || std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  std::string core = name();
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  if (core != "prescott") return "";
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

}  // namespace

void ensure_startup_environment(char** argv) {
  bool restart = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    restart = true;
  }
  if (const std::string core = openblas_core_for_this_cpu(); !core.empty()) {
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    restart = true;
  }
  if (restart) execv("/proc/self/exe", argv);  // returns only on failure; then run as we are
}

// A training step frees and reallocates the same tensors over and over. glibc's defaults give
// blocks over 128 KiB their own mmap and hand freed heap top back to the kernel, so every step pays
// page faults and zeroing for memory it just returned (half the CPU time was kernel time on the
// 2-core machine). Keeping freed memory in the process, as PyTorch's caching allocators do on
// GPUs, made a tiny Qwen2-VL step 20% faster there.
void keep_freed_memory() {
#ifdef __GLIBC__
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (std::getenv(name) != nullptr) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: blocks up to 32 MiB come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // give the heap top back only beyond 1 GiB free
  mallopt(M_TOP_PAD, 256 << 20);        // and grow it in 256 MiB steps
#endif
}

void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
}

// OpenMP's own default is not used: on the 2-core machine libgomp offered 1 thread, so a default job
// left a core idle.
void use_threads(int64_t configured, int64_t local_processes) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int64_t available = std::max<int64_t>(
      1, sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : sysconf(_SC_NPROCESSORS_ONLN));
  int64_t threads = configured;
  if (threads <= 0) threads = std::max<int64_t>(1, available / std::max<int64_t>(local_processes, 1));
  // Far more threads than cores only contend (and a million of them took minutes to create).
  const int64_t most = kThreadsPerCore * available;
  if (threads > most) {
    spdlog::warn("training.threads: {} is more than {} x the {} cores this process may run on; using {}",
                 threads, kThreadsPerCore, available, most);
    threads = most;
  }
  at::set_num_threads(static_cast<int>(threads));
  set_blas_threads(static_cast<int>(threads));
}

}  // namespace loom::cli
