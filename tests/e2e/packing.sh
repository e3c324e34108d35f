# Training on packed micro-batches (one padding-free row per micro-batch, attention kept within
# each sample) gives, step by step, the loss and grad norm of training on padded rows.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=12 --set training.global_batch_size=16 --set training.micro_batch_size=8
        --set training.warmup_steps=2 --set training.save_every=0)
small_job "${common[@]}" --set data.packing=false --set training.output_dir="$WORK/padded" > "$WORK/padded.log" 2>&1 ||
  { cat "$WORK/padded.log"; fail "padded run"; }
small_job "${common[@]}" --set data.packing=true --set training.output_dir="$WORK/packed" > "$WORK/packed.log" 2>&1 ||
  { cat "$WORK/packed.log"; fail "packed run"; }
python3 - "$WORK/padded/metrics.jsonl" "$WORK/packed/metrics.jsonl" <<'PY'
import json, sys
def steps(path):
    return {r["step"]: r for r in map(json.loads, open(path)) if "loss" in r}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert sorted(a) == sorted(b) == list(range(1, 13)), (sorted(a), sorted(b))
for key in ("loss", "grad_norm"):
    worst = max(abs(a[s][key] - b[s][key]) / abs(a[s][key]) for s in a)
    print(f"packed vs padded, steps 1-12: max relative {key} difference {worst:.3e}")
    assert worst <= 1e-5, (key, worst)
PY
echo "packing: same losses and grad norms as padded batches"
