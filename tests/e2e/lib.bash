# Shared helpers for the end-to-end tests: each test gets the loom binary and the source dir.
set -euo pipefail
LOOM=$1
SRC=$2
WORK=$(mktemp -d)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# A fast variant of the built-in tiny job for tests.
small_job() {
  "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.threads=2 --set data.eval_samples=50 \
    --set tools.progress_bar=false --set training.eval_every=0 "$@"
}
# The tiny job on several processes through `loom run`, with the calling test's `common` options:
# name (its output_dir is $WORK/name, its log $WORK/name.log), ranks, extra options.
parallel_run() {
  local name=$1 ranks=$2
  shift 2
  "$LOOM" run -n "$ranks" -- "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" "${common[@]}" \
    --set data.eval_samples=50 --set tools.progress_bar=false --set training.eval_every=0 \
    --set training.micro_batch_size=4 --set training.output_dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; fail "$name run"; }
}
