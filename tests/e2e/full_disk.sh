# Resuming on a nearly full disk: metrics.jsonl's rewrite for the resumed step cannot be written, so
# the run stops with an error naming the file and the OS reason, and the old metrics.jsonl is left
# byte for byte as it was (it used to be cut mid-line, the later steps lost, without an error). The
# disk is a small tmpfs, which needs root; elsewhere the test says so and passes.
source "$(dirname "$0")/lib.bash"
MNT="$WORK/disk"
mkdir -p "$MNT"
if [ "$(id -u)" -ne 0 ] || ! mount -t tmpfs -o size=64m tmpfs "$MNT" 2> "$WORK/mount.err"; then
  echo "full disk: skipped (mounting a tmpfs needs root: $(cat "$WORK/mount.err" 2>/dev/null))"
  exit 0
fi
trap 'umount "$MNT" 2>/dev/null || true; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
run="$MNT/run"
job=("$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.output_dir="$run"
  --set training.threads=1 --set data.eval_samples=4 --set tools.progress_bar=false
  --set training.global_batch_size=8 --set training.micro_batch_size=8 --set training.steps=200
  --set training.save_every=100)
"${job[@]}" > "$WORK/first.log" 2>&1 || { cat "$WORK/first.log"; fail "the first run"; }
cp "$run/metrics.jsonl" "$WORK/metrics.before"
[ "$(wc -l < "$WORK/metrics.before")" -ge 200 ] || fail "the first run logged $(wc -l < "$WORK/metrics.before") lines"
# Leave three pages free: room for job.yaml's rewrite, not for the 100 metrics lines kept on resume.
avail=$(df --output=avail -B1 "$MNT" | tail -n 1)
fallocate -l $((avail - 3 * 4096)) "$MNT/filler"
if "${job[@]}" --set training.resume="$run/step-00000100" > "$WORK/resume.log" 2>&1; then
  cat "$WORK/resume.log"
  fail "resuming on a full disk succeeded"
fi
grep -q "loom: error: metrics log: cannot rewrite $run/metrics.jsonl for the resume at step 100 (left as it was): .*No space left on device" "$WORK/resume.log" ||
  { cat "$WORK/resume.log"; fail "the error does not name metrics.jsonl and ENOSPC"; }
cmp "$WORK/metrics.before" "$run/metrics.jsonl" || fail "metrics.jsonl changed"
grep "loom: error" "$WORK/resume.log"
# With room again, the same command resumes and the log is the straight run's first 100 steps, then
# the resumed ones.
rm "$MNT/filler"
"${job[@]}" --set training.resume="$run/step-00000100" > "$WORK/resume2.log" 2>&1 ||
  { cat "$WORK/resume2.log"; fail "resuming with room"; }
head -n 100 "$WORK/metrics.before" | cmp - <(head -n 100 "$run/metrics.jsonl") || fail "the kept lines differ"
echo "full disk: the resume stopped with a named error and metrics.jsonl was kept whole"
