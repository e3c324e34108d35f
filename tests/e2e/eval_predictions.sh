# `loom eval --predictions` writes one line per held-out question; the accuracy recomputed from
# those lines equals what eval prints and what training logged for the same checkpoint.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=8 --set training.global_batch_size=16 --set training.micro_batch_size=16
        --set training.warmup_steps=2 --set training.save_every=0 --set training.output_dir="$WORK/run")
small_job "${common[@]}" > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail train; }
"$LOOM" eval "$SRC/configs/shapes-qwen2vl-tiny.yaml" --checkpoint "$WORK/run/step-00000008" \
  --set data.eval_samples=50 --set training.threads=2 --predictions "$WORK/predictions.jsonl" > "$WORK/eval.log" 2>&1 ||
  { cat "$WORK/eval.log"; fail eval; }
python3 - "$WORK" <<'PY'
import collections, json, re, sys
work = sys.argv[1]
rows = [json.loads(line) for line in open(f"{work}/predictions.jsonl")]
assert len(rows) == 50, len(rows)
for r in rows:
    assert set(r) == {"question", "answer", "predicted", "question_type"}, r
    assert r["question_type"] in {"color", "shape", "count", "position"}, r
    assert r["question"].endswith("?") and r["answer"], r
right = sum(r["answer"] == r["predicted"] for r in rows)
log = open(f"{work}/eval.log").read()
printed = float(re.search(r"exact-match accuracy ([0-9.]+)% on 50 held-out questions", log).group(1))
assert abs(printed - 100 * right / 50) < 1e-9, (printed, right)
by_type = collections.defaultdict(list)
for r in rows:
    by_type[r["question_type"]].append(r["answer"] == r["predicted"])
for t, oks in by_type.items():
    m = re.search(rf"^  {t}\s+([0-9.]+)%\s+\({len(oks)} questions\)$", log, re.M)
    assert m and abs(float(m.group(1)) - 100 * sum(oks) / len(oks)) < 0.0051, (t, oks, log)
final = [json.loads(l) for l in open(f"{work}/run/metrics.jsonl") if "eval_accuracy" in l][-1]
assert final["step"] == 8 and abs(final["eval_accuracy"] - right / 50) < 1e-12, final
print(f"eval_predictions: {right}/50 right, matching the printed and the logged accuracy")
PY
