# A run stopped after step k and resumed gives, at every later step, the loss of the run that was
# never stopped (within 1e-6 relative), and ends with the same weights.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=24 --set training.global_batch_size=16 --set training.micro_batch_size=8
        --set training.warmup_steps=4 --set training.save_every=0)
small_job "${common[@]}" --set training.output_dir="$WORK/straight" > "$WORK/straight.log" 2>&1 ||
  { cat "$WORK/straight.log"; fail "uninterrupted run"; }
small_job "${common[@]}" --set training.output_dir="$WORK/split" --set training.exit_interval=10 > "$WORK/a.log" 2>&1 ||
  { cat "$WORK/a.log"; fail "first part"; }
[ -d "$WORK/split/step-00000010" ] || fail "no checkpoint at step 10"
[ ! -d "$WORK/split/step-00000024" ] || fail "the first part ran past its exit interval"
grep -q "eval:" "$WORK/a.log" && fail "the first part should stop before the final evaluation"
small_job "${common[@]}" --set training.output_dir="$WORK/split" > "$WORK/b.log" 2>&1 ||
  { cat "$WORK/b.log"; fail "resumed part"; }
grep -q "resumed from .*step-00000010 at step 10" "$WORK/b.log" || fail "did not resume from step 10"
python3 - "$WORK/straight/metrics.jsonl" "$WORK/split/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(a) == list(range(1, 25)), sorted(a)
assert sorted(b) == list(range(1, 25)), f"resumed metrics steps {sorted(b)}"
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in range(11, 25))
print(f"steps 11-24: max relative loss difference {worst:.3e}")
assert worst <= 1e-6, worst
PY
cmp "$WORK/straight/step-00000024/model.safetensors" "$WORK/split/step-00000024/model.safetensors" ||
  fail "final weights differ"
echo "resume: identical losses after resuming and identical final weights"
