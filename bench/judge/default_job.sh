#!/usr/bin/env bash
# The README's video job, timed and judged: trains the VAE, extracts the DiT's features, trains the
# DiT (each phase timed alone, in order, as the README runs them), then judges the DiT's held-out
# samples with moving_fashion_judge.py.
#
#   bash bench/judge/default_job.sh OUT [--samples N] [--vae KEY=VALUE]... [--dit KEY=VALUE]...
#
# OUT receives the runs (vae/, features/, dit/), each phase's log, times.txt and judge.txt. --samples
# is extract-features' count (default: the README's 8000); --vae and --dit pass --set overrides to
# the VAE job and to both DiT commands (extraction and training), for trying other settings.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: default_job.sh OUT [--samples N] [--vae KEY=VALUE]... [--dit KEY=VALUE]...}
shift
samples=8000 vae_set=() dit_set=()
while [ $# -gt 0 ]; do
  case $1 in
    --samples) samples=$2 ;;
    --vae) vae_set+=(--set "$2") ;;
    --dit) dit_set+=(--set "$2") ;;
    *) echo "default_job.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
loom=build/loom
export PATH="$PWD/.venv/bin:$PATH"  # the judge's python3: the project virtualenv's, as under CTest
python3 -c "import numpy, torch" 2> /dev/null ||
  { echo "default_job.sh: $(command -v python3) lacks torch or numpy (bash scripts/setup.sh --oracles)" >&2; exit 1; }
dit=(--set model.vae="$out/vae" --set data.features="$out/features" "${dit_set[@]}")

phase() {  # NAME COMMAND...: runs the command into OUT/NAME.log and appends its seconds to times.txt
  local name=$1 start
  shift
  start=$(date +%s)
  "$@" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; echo "default_job.sh: $name failed" >&2; exit 1; }
  echo "$name $(($(date +%s) - start)) s" | tee -a "$out/times.txt"
}

: > "$out/times.txt"
phase vae $loom train configs/wan-moving-fashion-vae.yaml --set training.output_dir="$out/vae" "${vae_set[@]}"
phase extract $loom data extract-features configs/wan-moving-fashion.yaml --samples "$samples" \
  --out "$out/features" "${dit[@]}"
phase dit $loom train configs/wan-moving-fashion.yaml --set training.output_dir="$out/dit" "${dit[@]}"
awk '{ total += $2 } END { printf "total %d s (%.1f min)\n", total, total / 60 }' "$out/times.txt" |
  tee -a "$out/times.txt"
samples_dir=$(ls -d "$out"/dit/samples/step-* | tail -1)
python3 bench/judge/moving_fashion_judge.py --samples "$samples_dir" > "$out/judge.txt" 2>&1
tail -1 "$out/judge.txt"
