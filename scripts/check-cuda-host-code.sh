#!/usr/bin/env bash
# Compiles Loom's CUDA-only host code on a machine without a CUDA libtorch: every translation unit
# that tests LOOM_TORCH_CUDA (device selection, the caching allocator's statistics, the input
# stager's copy stream, NCCL in Comm, the Kineto profile), syntax only, with LOOM_TORCH_CUDA and
# USE_C10D_NCCL set, as the build compiles it otherwise (its compile_commands.json), against this
# libtorch's headers (they carry c10/cuda, ATen/cuda and c10d's NCCL group) and a CUDA toolkit's
# (cuda_runtime_api.h, nccl.h). The CPU build compiles none of that code; a CUDA build compiles it for
# real. A CPU-only libtorch lacks one generated CUDA header (c10/cuda/impl/cuda_cmake_macros.h); it is
# written here.
#   bash scripts/check-cuda-host-code.sh BUILD_DIR
# Exit 0: compiled; 1: a compile error (printed); 77: no CUDA toolkit headers here.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:?usage: check-cuda-host-code.sh BUILD_DIR}
CUDA=${CUDA_HOME:-/usr/local/cuda}
[ -f "$CUDA/include/cuda_runtime_api.h" ] || { echo "check-cuda-host-code: no CUDA toolkit headers in $CUDA/include"; exit 77; }
nccl=-DUSE_C10D_NCCL
[ -f "$CUDA/include/nccl.h" ] || { nccl=; echo "check-cuda-host-code: no nccl.h in $CUDA/include: Comm's NCCL part is not checked"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/shim/c10/cuda/impl"
printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$work/shim/c10/cuda/impl/cuda_cmake_macros.h"
# Each file's own compile command, without its object, its precompiled header (built without these
# macros) and its output, plus the CUDA switches and include folders.
python3 - "$BUILD/compile_commands.json" "$work/commands" "$work/shim" "$CUDA/include" "$nccl" \
  $(grep -rl --include='*.cpp' 'LOOM_TORCH_CUDA' src apps) <<'PY' || exit 1
import json, shlex, sys, os
db, out, shim, cuda, nccl, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
by_file = {os.path.realpath(e["file"]): e for e in json.load(open(db))}
with open(out, "w") as f:
    for name in files:
        entry = by_file.get(os.path.realpath(name))
        if entry is None:
            sys.exit(f"check-cuda-host-code: {name} is not in {db}")
        args, skip = [], False
        for a in shlex.split(entry["command"]):
            if skip:
                skip = False
            elif a in ("-o", "-include", "-c"):
                skip = True
            elif a != "-Winvalid-pch":
                args.append(a)
        args += ["-DLOOM_TORCH_CUDA", "-DUSE_CUDA"] + ([nccl] if nccl else [])
        args += ["-isystem", shim, "-isystem", cuda, "-fsyntax-only", "-Werror", os.path.realpath(name)]
        f.write(name + "\t" + shlex.join(args) + "\n")
PY
status=0
while IFS=$'\t' read -r name command; do
  if ! (cd "$BUILD" && eval "$command") >"$work/log" 2>&1; then
    status=1
    echo "check-cuda-host-code: $name:"
    grep -E "error|warning" "$work/log" | head -20
  fi
done <"$work/commands"
[ "$status" -eq 0 ] && echo "check-cuda-host-code: $(wc -l <"$work/commands") files compiled with LOOM_TORCH_CUDA${nccl:+ and NCCL} against $(grep -m1 -o 'CUDA_VERSION [0-9]*' "$CUDA/include/cuda.h" 2>/dev/null || echo "$CUDA")"
exit $status
