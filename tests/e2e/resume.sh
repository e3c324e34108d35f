# A run stopped after step k and resumed gives, at every later step, the loss of the run that was
# never stopped (within 1e-6 relative), and ends with the same weights: on the generated shapes set,
# and on a 3-image Fashion-MNIST split stopped mid-epoch (its order is reshuffled every epoch).
source "$(dirname "$0")/lib.bash"

# check_resume NAME STEPS EXIT_AT ARGS...: ARGS run the job.
check_resume() {
  local name=$1 steps=$2 at=$3
  shift 3
  local last at_dir
  last=$(printf "step-%08d" "$steps")
  at_dir=$(printf "step-%08d" "$at")
  "$@" --set training.output_dir="$WORK/$name-straight" > "$WORK/$name-straight.log" 2>&1 ||
    { cat "$WORK/$name-straight.log"; fail "$name: uninterrupted run"; }
  "$@" --set training.output_dir="$WORK/$name-split" --set training.exit_interval="$at" > "$WORK/$name-a.log" 2>&1 ||
    { cat "$WORK/$name-a.log"; fail "$name: first part"; }
  [ -d "$WORK/$name-split/$at_dir" ] || fail "$name: no checkpoint at step $at"
  [ ! -d "$WORK/$name-split/$last" ] || fail "$name: the first part ran past its exit interval"
  grep -q "eval:" "$WORK/$name-a.log" && fail "$name: the first part should stop before the final evaluation"
  "$@" --set training.output_dir="$WORK/$name-split" > "$WORK/$name-b.log" 2>&1 ||
    { cat "$WORK/$name-b.log"; fail "$name: resumed part"; }
  grep -q "resumed from .*$at_dir at step $at" "$WORK/$name-b.log" || fail "$name: did not resume from step $at"
  python3 - "$WORK/$name-straight/metrics.jsonl" "$WORK/$name-split/metrics.jsonl" "$steps" "$at" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
steps, at = int(sys.argv[3]), int(sys.argv[4])
assert sorted(a) == list(range(1, steps + 1)), sorted(a)
assert sorted(b) == list(range(1, steps + 1)), f"resumed metrics steps {sorted(b)}"
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in range(at + 1, steps + 1))
print(f"steps {at + 1}-{steps}: max relative loss difference {worst:.3e}")
assert worst <= 1e-6, worst
PY
  cmp "$WORK/$name-straight/$last/model.safetensors" "$WORK/$name-split/$last/model.safetensors" ||
    fail "$name: final weights differ"
}

check_resume shapes 24 10 small_job --set training.steps=24 --set training.global_batch_size=16 \
  --set training.micro_batch_size=8 --set training.warmup_steps=4 --set training.save_every=0
# 2 samples a step over a 3-image epoch: step 5 stops after sample 10, a third of the way into
# epoch 3, and each epoch has its own order.
check_resume fashion 9 5 "$LOOM" train "$SRC/configs/fashion-qwen2vl-tiny.yaml" --set training.threads=2 \
  --set tools.progress_bar=false --set data.dir="$SRC/tests/fixtures/idx/fashion/good" \
  --set data.eval_samples=2 --set training.steps=9 --set training.global_batch_size=2 \
  --set training.micro_batch_size=2 --set training.warmup_steps=2 --set training.save_every=0 \
  --set training.eval_every=0
echo "resume: identical losses after resuming and identical final weights (shapes, fashion mid-epoch)"
