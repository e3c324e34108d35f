# bf16 mixed precision tracks the fp32 run of the same model and data; a frozen sub-module
# keeps its weights while the rest trains.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=12 --set training.global_batch_size=16 --set training.micro_batch_size=16
        --set training.warmup_steps=2 --set training.save_every=4 --set training.keep_last=5 --set training.lr=2e-3)
small_job "${common[@]}" --set training.output_dir="$WORK/fp32" > "$WORK/fp32.log" 2>&1 || { cat "$WORK/fp32.log"; fail fp32; }
small_job "${common[@]}" --set training.output_dir="$WORK/bf16" --set training.precision=bf16 > "$WORK/bf16.log" 2>&1 ||
  { cat "$WORK/bf16.log"; fail bf16; }
small_job "${common[@]}" --set training.output_dir="$WORK/frozen" --set "model.freeze=[visual]" > "$WORK/frozen.log" 2>&1 ||
  { cat "$WORK/frozen.log"; fail freeze; }
python3 - "$WORK" <<'PY'
import json, struct, sys
work = sys.argv[1]
def losses(run):
    return [r["loss"] for r in map(json.loads, open(f"{work}/{run}/metrics.jsonl")) if "loss" in r]
fp32, bf16 = losses("fp32"), losses("bf16")
rel = [abs(a - b) / a for a, b in zip(fp32, bf16)]
print("fp32:", [round(x, 4) for x in fp32])
print("bf16:", [round(x, 4) for x in bf16])
assert len(fp32) == len(bf16) == 12
assert rel[0] < 0.02, f"first-step loss differs by {rel[0]:.3%}"
assert max(rel) < 0.10, f"bf16 drifts from fp32 by {max(rel):.3%}"
assert bf16[-1] < 0.6 * bf16[0], "bf16 run did not learn"

def tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: data[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in header.items()}
a = tensors(f"{work}/frozen/step-00000004/model.safetensors")
b = tensors(f"{work}/frozen/step-00000012/model.safetensors")
visual = [k for k in a if k.startswith("visual.")]
assert visual and all(a[k] == b[k] for k in visual), "frozen visual weights changed"
changed = [k for k in a if not k.startswith("visual.") and a[k] != b[k]]
assert len(changed) == len(a) - len(visual), "the unfrozen weights should all train"
print(f"freeze: {len(visual)} visual tensors unchanged, {len(changed)} others trained")
PY
