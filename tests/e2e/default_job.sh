# README command (a)'s job: the tiny Qwen2-VL on the built-in shapes set reaches >= 95% exact-match
# accuracy on 1,000 held-out questions, and >= 90% on every question type.
source "$(dirname "$0")/lib.sh"
"$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.output_dir="$WORK/run" \
  --set tools.progress_bar=false > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "training failed"; }
tail -6 "$WORK/log"
python3 - "$WORK/run/metrics.jsonl" <<'PY'
import json, sys
final = [r for r in map(json.loads, open(sys.argv[1])) if "eval_accuracy" in r][-1]
types = {k: v for k, v in final.items() if k.startswith("eval_accuracy_")}
print("final:", final)
assert final["eval_accuracy"] >= 0.95, final
assert len(types) == 4 and all(v >= 0.90 for v in types.values()), types
PY
