# Data parallelism through `loom run` over Gloo: 20 fp32 steps of the tiny shapes job with the same
# seed and global batch give, on 2 ranks (2 micro-batches each) and on 4 ranks, the loss of the
# single-process run at every step and the same final weights, whether the gradient buckets are
# summed during backward (overlap, 1 MiB buckets) or after it, under ZeRO-1 on 4 ranks and under
# FSDP (ZeRO-3) on 4 ranks. Checkpoints of step 10 resume under another layout with the
# single-process losses of steps 11-20 (they hold the whole state whatever the layout): ZeRO-1 and
# FSDP dp=4 under plain dp=2, FSDP dp=4 under ZeRO-1 dp=2, plain dp=2 under FSDP dp=2.
# FSDP's model state per rank (parameters + gradients + optimizer state) is at most 0.3x that of
# one process. Then the failures: a world size the layout cannot use is a one-line error, and a
# rank killed mid-run stops the others with a message naming it.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=20 --set training.global_batch_size=16 --set training.warmup_steps=2
        --set training.save_every=0 --set training.threads=1 --set tools.log_every=5)
small_job "${common[@]}" --set training.micro_batch_size=8 --set training.output_dir="$WORK/one" \
  > "$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "single-process run"; }
parallel_run dp2 2 --set parallel.bucket_mb=1 --set training.save_every=10
parallel_run dp2_after_backward 2 --set parallel.overlap_grad_reduce=false
parallel_run dp4 4 --set parallel.bucket_mb=1
parallel_run zero1_dp4 4 --set parallel.zero=1 --set training.save_every=10
grep -q "^\[rank 0\] .*optimizer state [0-9.]* MiB (ZeRO-1: 1/4 of the master weights and moments)" "$WORK/zero1_dp4.log" ||
  { cat "$WORK/zero1_dp4.log"; fail "zero1: no memory report"; }
parallel_run fsdp_dp4 4 --set parallel.zero=3 --set training.save_every=10
grep -q "^\[rank 0\] .*(FSDP: 1/4 of every trainable parameter, gradient and moment, in the root unit and 5 block units visual.blocks.0 to model.layers.2)" \
  "$WORK/fsdp_dp4.log" || { cat "$WORK/fsdp_dp4.log"; fail "fsdp: no memory report"; }
# Step-10 checkpoints resumed under another layout: name, the run that saved it, options.
resume_run() {
  local name=$1 from=$2
  shift 2
  mkdir -p "$WORK/$name" && cp -r "$WORK/$from/step-00000010" "$WORK/$name/"
  parallel_run "$name" 2 "$@"
  grep -q "^\[rank 0\] .*resum.*step-00000010" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "no resume in $name"; }
}
resume_run resumed_dp2_zero1_dp4 zero1_dp4
resume_run resumed_dp2_fsdp_dp4 fsdp_dp4
resume_run resumed_zero1_dp2_fsdp_dp4 fsdp_dp4 --set parallel.zero=1
resume_run resumed_fsdp_dp2_dp2 dp2 --set parallel.zero=3
# Model state per rank: one process against FSDP on 4 ranks (rank 0 reports; the slices are equal).
python3 - "$WORK" <<'PY'
import re, sys
work = sys.argv[1]
one = int(re.search(r"model state per rank: (\d+) bytes", open(f"{work}/one.log").read()).group(1))
log = open(f"{work}/fsdp_dp4.log").read()
fsdp = int(re.search(r"\[rank 0\] .*memory on this rank: .*model state per rank: (\d+) bytes", log).group(1))
peak = int(re.search(r"\[rank 0\] .*FSDP: .*peak during passes (\d+) bytes more", log).group(1))
print(f"parameters + gradients + optimizer state per rank: one process {one} bytes, FSDP dp=4 {fsdp} bytes "
      f"= {fsdp / one:.3f}x; during passes {peak} bytes more (gathered units, unreduced gradients, "
      f"reduce-scatter buffers): {(fsdp + peak) / one:.3f}x at the peak")
assert fsdp <= 0.3 * one, (fsdp, one)
PY
# The tiny model's 3.5 MB of gradients make 4 buckets of 1 MiB; with overlap some start during
# backward (counted by the hooks, not timed), without it none do.
grep -q "^\[rank 0\] .*gradient all-reduce: .* (4 buckets of up to 1 MiB, overlap on; last step: [1-4] started during backward)" \
  "$WORK/dp2.log" || { cat "$WORK/dp2.log"; fail "dp=2: no bucket started during backward"; }
grep -q "^\[rank 0\] .*gradient all-reduce: .* (1 buckets of up to 25 MiB, overlap off; last step: 0 started during backward)" \
  "$WORK/dp2_after_backward.log" || { cat "$WORK/dp2_after_backward.log"; fail "dp=2 without overlap"; }
grep -q "global batch 16 = 2 data-parallel ranks x 2 x 4 micro-batches" "$WORK/dp2.log" ||
  { cat "$WORK/dp2.log"; fail "dp=2 layout not reported"; }
grep -q "^\[rank 0\] eval: exact-match accuracy" "$WORK/dp4.log" || fail "dp=4: rank 0 printed no evaluation"
! grep -q "^\[rank [123]\] eval:" "$WORK/dp4.log" || fail "dp=4: only rank 0 reports the evaluation"
python3 - "$WORK" "$(dirname "$0")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import steps, tensors
work = sys.argv[1]
one = steps(f"{work}/one/metrics.jsonl")
w1 = tensors(f"{work}/one/step-00000020/model.safetensors")
assert sorted(one) == list(range(1, 21))
for name in ("dp2", "dp2_after_backward", "dp4", "zero1_dp4", "fsdp_dp4", "resumed_dp2_zero1_dp4",
             "resumed_dp2_fsdp_dp4", "resumed_zero1_dp2_fsdp_dp4", "resumed_fsdp_dp2_dp2"):
    other = steps(f"{work}/{name}/metrics.jsonl")
    first = 11 if name.startswith("resumed") else 1
    assert sorted(other) == list(range(first, 21)), (name, sorted(other))
    worst = max(abs(one[s]["loss"] - other[s]["loss"]) / abs(one[s]["loss"]) for s in other)
    print(f"{name} vs one process, steps {first}-20: max relative loss difference {worst:.3e}")
    assert worst <= 1e-5, (name, worst)
    w = tensors(f"{work}/{name}/step-00000020/model.safetensors")
    assert sorted(w) == sorted(w1)
    diff = max(abs(x - y) for k in w1 for x, y in zip(w[k], w1[k]))
    print(f"{name} vs one process: max absolute final weight difference {diff:.3e}")
    assert diff <= 1e-5, (name, diff)
PY

# A world the layout cannot use: one line, before any work (from whichever rank checks first; the
# launcher then stops the others).
set +e
"$LOOM" run -n 3 -- "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" "${common[@]}" \
  --set training.micro_batch_size=4 --set training.output_dir="$WORK/bad" > "$WORK/bad.log" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] || fail "dp=3 with a global batch of 16 should fail"
grep -q "\[rank [0-2]\] loom: error: .*training.global_batch_size=16 is not divisible by micro_batch_size\*dp = 4\*3 = 12" \
  "$WORK/bad.log" || { cat "$WORK/bad.log"; fail "no one-line error for a wrong world size"; }
! grep -q "step 1/" "$WORK/bad.log" || fail "training started despite the wrong world size"

# Rank 1 killed once training runs: the launcher names it, stops rank 0 and exits with 128+9.
"$LOOM" run -n 2 -- "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.steps=100000 \
  --set training.global_batch_size=16 --set training.micro_batch_size=8 --set training.threads=1 \
  --set tools.progress_bar=false --set tools.log_every=1 --set training.output_dir="$WORK/killed" \
  > "$WORK/killed.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do grep -q "step 2/" "$WORK/killed.log" 2>/dev/null && break; sleep 0.5; done
grep -q "step 2/" "$WORK/killed.log" || { cat "$WORK/killed.log"; fail "the 2-rank run did not start"; }
victim=""
for pid in $(pgrep -f "output_dir=$WORK/killed"); do
  [ "$pid" != "$launcher" ] && tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "RANK=1" && victim=$pid
done
[ -n "$victim" ] || fail "rank 1's process not found"
kill -9 "$victim"
set +e
wait "$launcher"
code=$?
set -e
[ "$code" -eq 137 ] || { cat "$WORK/killed.log"; fail "launcher exit code $code, expected 137"; }
grep -q "loom run: rank 1 (pid $victim) was killed by signal 9" "$WORK/killed.log" ||
  { cat "$WORK/killed.log"; fail "the launcher did not name the lost rank"; }
! pgrep -f "output_dir=$WORK/killed" > /dev/null || fail "a rank outlived the launcher"
echo "data parallel: dp=2 and dp=4 match one process; bad world size and a killed rank reported"
