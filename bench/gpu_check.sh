#!/usr/bin/env bash
# One-shot check of Loom against a CUDA build of PyTorch 2.x, for the GPU device machine: it builds
# Loom (Release, Ninja, all cores) against the libtorch inside python3's torch wheel (the project
# virtualenv's where there is one; its CUDA runtime and NCCL come from the wheel's nvidia packages), trains 20 steps of the shapes job on the GPU in fp32 and
# compares the losses with the same steps on the CPU, times `loom bench` of a Qwen2-VL-7B-shaped
# stack and of the Wan DiT in bf16 on the GPU (tokens/s, MFU, the caching allocator's peaks), runs
# the unit tests (the CUDA kernels' on the GPU) and the CUDA kernel benchmarks, then
# e2e.data_parallel (dist::Comm over Gloo) when time allows.
#
# That machine has no network and none of Loom's Debian -dev packages, so they travel as Debian 12
# .deb files in the git-ignored folder .gpu/debs/ and are unpacked with `dpkg -x` into a private
# prefix (never into /). Fill that folder once, on a Debian 12 machine with apt:
#   bash bench/gpu_check.sh --fetch-debs
# then run on the device machine, from the repository root, with .gpu carried:
#   bash bench/gpu_check.sh
# `bash bench/gpu_check.sh --configure-only` stops after CMake's configure (a cheap local check).
# Logs go to $OUT (the device tool returns what is written there; ./gpu-out when $OUT is unset).
# Knobs: LOOM_GPU_BUILD (build dir, default build-gpu), LOOM_DEPS (prefix, default /tmp/loomdeps),
# LOOM_JOBS, LOOM_BUILD_TIMEOUT (s, default 360), LOOM_DEADLINE (s since the start by which the
# tests must be done, default 560).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
DEBS=$ROOT/.gpu/debs

# Debian 12 packages: the -dev packages Loom's CMakeLists and sources use, and their run-time
# libraries. zlib1g is only a fallback (the machine's own libz.so.1 is preferred); libgloo-dev gives
# the Gloo headers c10d's ProcessGroupGloo.hpp includes, used only when the torch package has none;
# dataset-fashion-mnist the images the Wan DiT's benchmark clips are made of. FFmpeg's libraries are not
# among them (their dependencies would not fit): Loom builds without video files there.
PACKAGES=(libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libcli11-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libre2-dev libre2-9
  libturbojpeg0-dev libturbojpeg0 libpng-dev libpng16-16 zlib1g-dev zlib1g libsentencepiece-dev
  libsentencepiece0 libgloo-dev libgif-dev libgif7 dataset-fashion-mnist)

if [ "${1:-}" = "--fetch-debs" ]; then
  exclude=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$exclude")" &&
    { grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"; }
  rm -rf "$DEBS" && mkdir -p "$DEBS" && cd "$DEBS" || exit 1
  apt-get download "${PACKAGES[@]}" || exit 1
  for f in *%3a*; do [ -e "$f" ] && mv "$f" "${f//%3a/_}"; done  # epochs: plain file names
  ls -l && du -sh .
  exit 0
fi

OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
B=${LOOM_GPU_BUILD:-$ROOT/build-gpu}
P=${LOOM_DEPS:-/tmp/loomdeps}
ARCH=x86_64-linux-gnu
L=$P/usr/lib/$ARCH
JOBS=${LOOM_JOBS:-$(nproc)}
DEADLINE=${LOOM_DEADLINE:-560}
T0=$(date +%s)
STATUS=0
elapsed() { echo $(($(date +%s) - T0)); }
log() { printf '[%s +%4ss] %s\n' "$(date +%H:%M:%S)" "$(elapsed)" "$*"; }
section() { echo; log "== $*"; }
summary=()
note() { summary+=("$*"); log "$*"; }

[ -d /opt/torch/.venv/bin ] && export PATH=/opt/torch/.venv/bin:$PATH
[ -x "$ROOT/.venv/bin/python3" ] && export PATH=$ROOT/.venv/bin:$PATH
command -v nvcc >/dev/null || for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
  [ -x "$d/nvcc" ] && export PATH=$PATH:$d && break
done

section "machine"
{
  echo "uname: $(uname -srm)   cores: $(nproc)   $(grep -m1 MemTotal /proc/meminfo)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")   glibc: $(ldd --version 2>/dev/null | head -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "c++: $(c++ --version 2>&1 | head -1)"
  echo "g++: $(g++ --version 2>&1 | head -1)"
  echo "nvcc: $(nvcc --version 2>&1 | tail -2 | tr '\n' ' ')"
  echo "cmake: $(cmake --version 2>&1 | head -1)   ninja: $(ninja --version 2>&1)   $(dpkg --version 2>&1 | head -1)"
  echo "python3: $(command -v python3) $(python3 --version 2>&1)"
  python3 - "$OUT/torch-config.txt" <<'PY' 2>&1
import sys
import torch
print(f"torch {torch.__version__}  cuda {torch.version.cuda}  cuda available {torch.cuda.is_available()}"
      f"  devices {torch.cuda.device_count()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"gpu 0: {p.name}  sm_{p.major}{p.minor}  {p.total_memory / 2**30:.0f} GiB  {p.multi_processor_count} SMs")
print(f"cxx11 abi {torch._C._GLIBCXX_USE_CXX11_ABI}")
print(f"cmake prefix: {torch.utils.cmake_prefix_path}")
open(sys.argv[1], "w").write(torch.__config__.show())
PY
} 2>&1 | tee "$OUT/info.log"

TORCH_CMAKE=$(sed -n 's/^cmake prefix: //p' "$OUT/info.log")
if [ -z "$TORCH_CMAKE" ] || [ ! -f "$TORCH_CMAKE/Torch/TorchConfig.cmake" ]; then
  note "FAIL: python3 has no torch with a TorchConfig.cmake ('$TORCH_CMAKE')"; exit 1
fi
TI=$(cd "$TORCH_CMAKE/../../include" && pwd)
{
  echo "torch include: $TI"
  echo "  top level: $(ls "$TI" | tr '\n' ' ')"
  for h in gloo/algorithm.h fmt/format.h nlohmann/json.hpp; do [ -e "$TI/$h" ] && echo "  ships $h"; done
  grep -m1 -h "define FMT_VERSION" "$TI/fmt/base.h" "$TI/fmt/core.h" 2>/dev/null | sed 's/^/  torch fmt: /'
  grep -m1 -h "define TORCH_VERSION " -A1 "$TI/torch/csrc/api/include/torch/version.h" 2>/dev/null | tr -s ' \\\n' ' '
  echo
} 2>&1 | tee -a "$OUT/info.log"
cat "$OUT/torch-config.txt" >>"$OUT/info.log" 2>/dev/null && rm -f "$OUT/torch-config.txt"

section "dependencies: unpack .gpu/debs into $P"
if ! ls "$DEBS"/*.deb >/dev/null 2>&1; then
  note "FAIL: no .deb files in $DEBS (run 'bash bench/gpu_check.sh --fetch-debs' on Debian 12, carry .gpu)"; exit 1
fi
rm -rf "$P" && mkdir -p "$P"
for f in "$DEBS"/*.deb; do dpkg -x "$f" "$P" || { note "FAIL: dpkg -x $f"; exit 1; }; done
# zlib1g-dev's libz.so points at /lib/$ARCH/libz.so.1.2.13: point it at this machine's libz.so.1
# (else at the unpacked Debian copy), so one zlib is loaded.
sys_z=$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$sys_z" ] && [ -e "$sys_z" ] || sys_z=$(ls "$P"/lib/$ARCH/libz.so.1.* 2>/dev/null | head -1)
ln -sfn "$sys_z" "$L/libz.so"
# pkg-config files say prefix=/usr; CMake's config files compute their prefix from their own place.
sed -i -e "s#^prefix=/usr\$#prefix=$P/usr#" -e "s#=/usr/#=$P/usr/#g" "$L"/pkgconfig/*.pc "$P"/usr/share/pkgconfig/*.pc
log "unpacked $(ls "$DEBS"/*.deb | wc -l) packages ($(du -sh "$P" | cut -f1)); libz.so -> $sys_z"
if [ -e "$TI/gloo/algorithm.h" ]; then log "gloo headers: the torch package's"
else log "gloo headers: Debian's libgloo-dev 2022-05 (the torch package has none)"; fi

section "configure ($B)"
CUDACXX=${CUDACXX:-$(command -v nvcc)}
if [ -n "$CUDACXX" ]; then
  export CUDACXX CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$CUDACXX")")")}
else
  unset CUDACXX
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export LIBRARY_PATH=$L${LIBRARY_PATH:+:$LIBRARY_PATH}  # Loom links re2 and turbojpeg by bare name
export PKG_CONFIG_PATH=$L/pkgconfig:$P/usr/share/pkgconfig
# Loom's CMake takes libtorch, the CUDA runtime and NCCL from python3's torch wheel (LOOM_PYTHON).
cuda_args=(-DLOOM_PYTHON="$(command -v python3)" -DLOOM_CUDA_ARCHITECTURES=90)
[ -n "${CUDACXX:-}" ] && cuda_args+=(-DCMAKE_CUDA_COMPILER="$CUDACXX")
rm -rf "$B"
t=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$P/usr" \
  -Dyaml-cpp_DIR="$L/cmake/yaml-cpp" -Dfmt_DIR="$L/cmake/fmt" -Dspdlog_DIR="$L/cmake/spdlog" \
  -DGTest_DIR="$L/cmake/GTest" -Dbenchmark_DIR="$L/cmake/benchmark" \
  -Dnlohmann_json_DIR="$P/usr/share/cmake/nlohmann_json" -DCLI11_DIR="$P/usr/share/cmake/CLI11" \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${cuda_args[@]}" 2>&1 | tee "$OUT/configure.log" | grep -E "^CMake (Error|Warning)|Found|rror" | awk 'NR <= 40'
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
  cp "$B"/CMakeFiles/CMakeConfigureLog.yaml "$OUT/" 2>/dev/null || cp "$B"/CMakeFiles/CMakeError.log "$OUT/" 2>/dev/null
  tail -40 "$OUT/configure.log"
  note "FAIL: configure ($(($(date +%s) - t)) s); see configure.log"
  exit 1
fi
grep -E "^(yaml-cpp|fmt|spdlog|GTest|benchmark|nlohmann_json|CLI11)_DIR|^LOOM_(PYTHON|CUDART|NCCL_LIBRARY)|^(PNG_LIBRARY_RELEASE|ZLIB_LIBRARY_RELEASE|PNG_PNG_INCLUDE_DIR):" \
  "$B/CMakeCache.txt" | sed 's/^/  /'
note "configure: OK in $(($(date +%s) - t)) s; $(grep -m1 -o "Loom CUDA jobs: .*" "$OUT/configure.log")"
python3 - "$B/compile_commands.json" <<'PY'
import json, sys
for e in json.load(open(sys.argv[1])):
    if e["file"].endswith("src/loom/dist/comm.cpp"):
        print("  comm.cpp compiles as:", e["command"][:1500])
PY
[ "${1:-}" = "--configure-only" ] && exit 0

section "build (-j$JOBS)"
# The test binaries run at build time (gtest discovery), so the unpacked libraries must be found now.
export LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
CXX_USED=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$B/CMakeCache.txt")
log "compiler: $CXX_USED ($("$CXX_USED" --version | head -1))"
t=$(date +%s)
timeout "${LOOM_BUILD_TIMEOUT:-360}" cmake --build "$B" -j "$JOBS" -- -k 0 2>&1 | tee "$OUT/build.log" |
  grep -E "^\[[0-9]+/[0-9]+\]" | awk 'NR % 20 == 0' | cut -c1-140
build_rc=${PIPESTATUS[0]}
build_s=$(($(date +%s) - t))
if [ "$build_rc" -eq 0 ]; then
  note "build: OK, wall time $build_s s with $JOBS jobs"
else
  STATUS=1
  note "FAIL: build (exit $build_rc; 124 = timed out) after $build_s s, $(grep -c 'error:' "$OUT/build.log") error lines; first:"
  grep -E "error:|undefined reference|FAILED:" "$OUT/build.log" | awk 'NR <= 40' | cut -c1-400
fi
warnings=$(grep -c "warning:" "$OUT/build.log")
log "compiler warnings: $warnings"
[ "$warnings" -gt 0 ] && grep "warning:" "$OUT/build.log" | sed 's/.*warning: //' | sort | uniq -c | sort -rn | awk 'NR <= 8'

# Training on the GPU: the shapes job's first 20 steps in fp32 (TF32 off), on the CPU and on the GPU
# from the same initial weights and data; the losses must agree to 1e-4 relative. Then loom bench
# of the 7B-shaped stack and of the Wan DiT in bf16 on the GPU.
section "training on the GPU"
W=$OUT/runs
mkdir -p "$W"
budget() {  # the seconds a step may take: at most $1, and 60 s kept for the rest of the check
  local left=$((DEADLINE - $(elapsed) - 60))
  [ "$left" -lt "$1" ] && set -- "$left"
  [ "$1" -lt 15 ] && set -- 15
  echo "$1"
}
shapes_run() {  # device, seconds
  timeout "$(budget "$2")" "$B/loom" train configs/shapes-qwen2vl-tiny.yaml --set training.device="$1" --set training.steps=20 \
    --set training.output_dir="$W/shapes-$1" --set training.resume=none --set training.save_every=0 \
    --set training.eval_every=0 --set data.eval_samples=16 --set tools.log_every=5 >"$OUT/train-$1.log" 2>&1
}
# loom bench's last line is its JSON report.
bench_run() {  # name, config, seconds, steps, more --set arguments...
  local name=$1 config=$2 seconds=$3 steps=$4 rc line
  shift 4
  timeout "$(budget "$seconds")" "$B/loom" bench "$config" --steps "$steps" --warmup 2 --set training.device=cuda \
    --set training.output_dir="$W/bench-$name" "$@" >"$OUT/bench-$name.log" 2>&1
  rc=$?
  python3 - "$OUT/bench-$name.log" >"$OUT/bench-$name.line" 2>&1 <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
r = json.loads(lines[-1])
m = r.get("device_memory", {})
print(f"{r['device']}: {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.1f}% of "
      f"{r['sgemm_gflops'] / 1000:.0f} TFLOP/s, step {r['step_time_median_s'] * 1000:.0f} ms, peak allocated "
      f"{m.get('peak_allocated_mib', 0) / 1024:.1f} GiB, reserved {m.get('peak_reserved_mib', 0) / 1024:.1f} GiB")
PY
  line=$(cat "$OUT/bench-$name.line")
  if [ "$rc" -eq 0 ]; then
    note "bench $name: $line"
  else
    STATUS=1
    note "FAIL: bench $name (exit $rc; 124 = timed out): $(grep -E "error|what" "$OUT/bench-$name.log" | tail -2)"
  fi
}
if [ ! -x "$B/loom" ]; then
  STATUS=1
  note "FAIL: GPU training: no loom binary"
else
  t=$(date +%s)
  shapes_run cpu 90
  cpu_rc=$?
  shapes_run cuda 90
  cuda_rc=$?
  tail -4 "$OUT/train-cuda.log"
  python3 - "$W/shapes-cpu/metrics.jsonl" "$W/shapes-cuda/metrics.jsonl" >"$OUT/train-compare.txt" 2>&1 <<'PY'
import json, sys
def losses(path):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(path)) if "lr" in r]
cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
if len(cpu) != 20 or [s for s, _ in cpu] != [s for s, _ in gpu]:
    print(f"FAIL: {len(cpu)} CPU and {len(gpu)} GPU steps"); sys.exit(1)
worst = max(abs(a - b) / max(abs(a), 1e-12) for (_, a), (_, b) in zip(cpu, gpu))
print(f"{'OK' if worst <= 1e-4 else 'FAIL'}: 20 steps, max relative loss difference {worst:.2e} (bound 1e-4); "
      f"step 1 {cpu[0][1]:.6f} / {gpu[0][1]:.6f}, step 20 {cpu[-1][1]:.6f} / {gpu[-1][1]:.6f} (cpu / gpu)")
sys.exit(0 if worst <= 1e-4 else 1)
PY
  compare_rc=$?
  compared=$(tail -1 "$OUT/train-compare.txt")
  [ "$cpu_rc" -ne 0 ] && grep -E "error" "$OUT/train-cpu.log" | tail -3
  [ "$cuda_rc" -ne 0 ] && grep -E "error|what|terminate" "$OUT/train-cuda.log" | tail -5
  if [ "$cpu_rc" -eq 0 ] && [ "$cuda_rc" -eq 0 ] && [ "$compare_rc" -eq 0 ]; then
    note "GPU training (shapes, fp32): $compared; $(($(date +%s) - t)) s"
  else
    STATUS=1
    note "FAIL: GPU training (shapes, fp32): cpu exit $cpu_rc, cuda exit $cuda_rc; $compared"
  fi
  bench_run qwen2vl-7b-shaped configs/bench-qwen2vl-7b-shaped.yaml 120 6
  bench_run wan-dit configs/bench-wan-100m.yaml 90 6 --set training.precision=bf16 \
    --set data.dir="$P/usr/share/datasets/fashion-mnist"
fi

# Unit tests: every gtest case is one ctest test. The real Fashion-MNIST files (Debian's
# dataset-fashion-mnist, 30 MB) are not where the tests look for them on that machine (/usr/share/datasets;
# the Wan benchmark reads the unpacked copy): the tests that read them (FashionVqaReal.*, VqaData.*) are
# left out. The e2e scripts are slow; only data_parallel runs.
section "unit tests (ctest -j$JOBS)"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}  # as on the 2-core CI machine, with 16 tests at once
left=$((DEADLINE - $(elapsed) - 60))
[ "$left" -gt 180 ] && left=180
[ "$left" -lt 30 ] && left=30
t=$(date +%s)
# Nor does FFmpeg: the tests of video files (DecodeVideo, Mp4Writer, VideoClips, CaptionedMedia) are left out too.
timeout "$left" ctest --test-dir "$B" -E '^e2e\.|^(FashionVqaReal|VqaData|DecodeVideo|Mp4Writer|VideoClips|CaptionedMedia)\.|^kernels\.cuda_device_code$' -j "$JOBS" --timeout 120 \
  --output-on-failure 2>&1 | tee "$OUT/ctest-unit.log" |
  grep -E "tests passed|tests failed|Total Test time|\*\*\*|Failed|Not Run" | awk 'NR <= 60'
unit_rc=${PIPESTATUS[0]}
cp "$B/Testing/Temporary/LastTest.log" "$OUT/LastTest-unit.log" 2>/dev/null  # every test's own output
unit_line=$(grep -E "tests passed" "$OUT/ctest-unit.log" | tail -1)
if [ "$unit_rc" -eq 0 ]; then
  note "unit tests: OK, ${unit_line:-?} in $(($(date +%s) - t)) s"
else
  STATUS=1
  note "FAIL: unit tests (exit $unit_rc; 124 = cut at $left s): ${unit_line:-no summary} in $(($(date +%s) - t)) s"
fi

# A crashing test: its backtrace (cuda-gdb debugs host-only programs too), the C++ runtime it loads,
# and the same test binary built by the machine's other C++ compiler, to tell a Loom bug from a
# toolchain mismatch.
crash=$(grep -m1 -oE "Test +#[0-9]+: [A-Za-z0-9_.]+ .*SegFault" "$OUT/ctest-unit.log" | awk '{print $3}')
if [ -n "$crash" ]; then
  section "diagnose $crash"
  bin=$(grep -m1 -B1 "gtest_filter=$crash\"" "$B/Testing/Temporary/LastTest.log" | grep -oE '"[^"]+_tests"' | tr -d '"' | head -1)
  {
    echo "binary: $bin"
    ldd "$bin" | grep -E "stdc\+\+|libgcc|libfmt|libtorch_cpu"
    command -v cuda-gdb >/dev/null &&
      timeout 90 cuda-gdb -q -batch -ex run -ex bt --args "$bin" "--gtest_filter=$crash" 2>&1 | grep -vE "^\[(New|Thread)" | tail -40
    other=/usr/bin/g++
    if [ -x "$other" ] && [ "$(readlink -f "$other")" != "$(readlink -f "$CXX_USED")" ]; then
      echo "--- the same tests built by $other ($($other --version | head -1))"
      B2=$B-other
      target=$(basename "$bin")
      cmake -S . -B "$B2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$other" \
        -DCMAKE_PREFIX_PATH="$P/usr" \
        -Dyaml-cpp_DIR="$L/cmake/yaml-cpp" -Dfmt_DIR="$L/cmake/fmt" -Dspdlog_DIR="$L/cmake/spdlog" \
        -DGTest_DIR="$L/cmake/GTest" -Dbenchmark_DIR="$L/cmake/benchmark" \
        -Dnlohmann_json_DIR="$P/usr/share/cmake/nlohmann_json" -DCLI11_DIR="$P/usr/share/cmake/CLI11" \
        "${cuda_args[@]}" >/dev/null 2>&1 &&
        timeout 150 cmake --build "$B2" -j "$JOBS" --target "$target" 2>&1 | grep -E "error|FAILED" | head -20
      (cd "$B" && timeout 120 "$B2/$target" 2>&1 | grep -E "^\[  (PASSED|FAILED) |tests ran|Segmentation" | head -20)
      echo "exit of $B2/$target: $?"
    fi
  } 2>&1 | tee "$OUT/diagnose.log"
fi

# The CUDA kernels: their tests ran above (CudaKernels.*: against the composites on the GPU); here
# their speed against the composites, forward + backward in bf16, through the public entry points.
section "CUDA kernels"
cuda_tests=$(grep -cE "Test +#[0-9]+: CudaKernels\.[A-Za-z]+ \.+ +Passed" "$OUT/ctest-unit.log")
cuda_failed=$(grep -E "Test +#[0-9]+: CudaKernels\.[A-Za-z]+ .*(Failed|SEGFAULT|Exception|Timeout)" "$OUT/ctest-unit.log" |
  awk '{print $4}' | tr '\n' ' ')
note "CUDA kernel tests on the GPU: $cuda_tests passed${cuda_failed:+; FAILED: $cuda_failed}"
left=$((DEADLINE - $(elapsed) - 150))
[ "$left" -gt 120 ] && left=120
if [ ! -x "$B/loom_bench_kernels_cuda" ]; then
  note "CUDA kernel benchmarks: not run (not built)"
elif [ "$left" -lt 30 ]; then
  note "CUDA kernel benchmarks: not run (only $left s left for them)"
else
  timeout "$left" "$B/loom_bench_kernels_cuda" --benchmark_min_time=0.3 2>&1 | tee "$OUT/bench-cuda.log" |
    grep -E "^(Attention|RmsNorm|Swiglu|Rotary)|rror"
  python3 - "$OUT/bench-cuda.log" <<'PY' | tee -a "$OUT/bench-cuda.log"
import re, sys
times = {}
for line in open(sys.argv[1]):
    m = re.match(r"^(\S+?)(?:/real_time)?\s+([0-9.]+) ms", line)
    if m:
        times[m.group(1)] = float(m.group(2))
for name, t in times.items():
    other = name.replace("/flash/", "/composite/").replace("/fused", "/composite")
    if other != name and other in times:
        print(f"speedup {name}: {times[other] / t:.2f}x ({t:.3f} ms against {times[other]:.3f} ms)")
PY
  while read -r line; do note "$line"; done < <(grep "^speedup" "$OUT/bench-cuda.log")
fi

section "e2e.data_parallel (Gloo, TCPStore)"
left=$((DEADLINE - $(elapsed)))
if [ ! -x "$B/loom" ]; then
  note "e2e.data_parallel: not run (no loom binary)"
elif [ "$left" -lt 45 ]; then
  note "e2e.data_parallel: not run (only $left s left before the deadline)"
else
  [ "$left" -gt 150 ] && left=150
  t=$(date +%s)
  timeout "$left" ctest --test-dir "$B" -R '^e2e\.data_parallel$' --output-on-failure -V 2>&1 | tee "$OUT/ctest-e2e.log" |
    grep -E "max relative|max absolute|FAIL|tests passed|tests failed" | sed 's/^[0-9]*: //'
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then
    note "e2e.data_parallel: OK in $(($(date +%s) - t)) s"
  else
    STATUS=1
    note "FAIL: e2e.data_parallel after $(($(date +%s) - t)) s; see ctest-e2e.log"
  fi
fi

section "summary"
{
  grep -E "^torch |^gpu 0|^c\+\+:|^nvcc|^cmake:" "$OUT/info.log"
  echo "gloo headers: $([ -e "$TI/gloo/algorithm.h" ] && echo torch || echo Debian)"
  printf '%s\n' "${summary[@]}"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|SEGFAULT|Subprocess aborted|Exception|Child aborted)\)" \
    "$OUT/ctest-unit.log" | awk 'NR <= 40'
  echo "total wall time $(elapsed) s; exit $STATUS; logs in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
} | tee "$OUT/summary.txt"
exit $STATUS
