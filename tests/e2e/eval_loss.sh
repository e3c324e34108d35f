# The held-out loss is the training loss's formula: with the held-out file the training file and a
# global batch of the whole file, the evaluation after step 1 and the loss of step 2 see the same
# samples with the same weights, so eval_loss equals step 2's loss (up to summation order and the
# packed rows training uses), its perplexity is exp(loss), and the per-file loss is logged too.
source "$(dirname "$0")/lib.bash"
FIX="$SRC/tests/fixtures/conversations"
cat > "$WORK/chat.jsonl" <<'JSONL'
{"messages": [{"role": "user", "content": "<image>Shape?"}, {"role": "assistant", "content": "square"}], "images": ["images/red.png"]}
{"messages": [{"role": "system", "content": "Short answers."}, {"role": "user", "content": "Sky<image>"}, {"role": "assistant", "content": "blue"}], "images": ["images/sky.jpg"]}
{"messages": [{"role": "user", "content": "Say ok."}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Again."}, {"role": "assistant", "content": "ok ok"}]}
{"messages": [{"role": "user", "content": "<image>Tone?"}, {"role": "assistant", "content": "grey"}], "images": ["images/grey.png"]}
JSONL
cat > "$WORK/job.yaml" <<YAML
$(tiny_chat_model)
data:
  dataset: messages
  tokenizer: $FIX/chatml_bpe_tokenizer.json
  datasets: [{path: $WORK/chat.jsonl, root: $FIX}]
  eval_datasets: [{path: $WORK/chat.jsonl, root: $FIX}]
  eval_samples: 4
  max_pixels: 3136
  packing: true
training:
  steps: 2
  global_batch_size: 4
  micro_batch_size: 2
  lr: 1.0e-3
  warmup_steps: 0
  eval_every: 1
  threads: 2
  output_dir: $WORK/run
tools:
  progress_bar: false
YAML
"$LOOM" train "$WORK/job.yaml" > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail train; }
python3 - "$WORK" <<'PY'
import json, math, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/run/metrics.jsonl")]
step2 = [r for r in rows if r.get("step") == 2 and "loss" in r][0]
evals = [r for r in rows if "eval_loss" in r]
assert [r["step"] for r in evals] == [1, 2], evals
first = evals[0]
rel = abs(first["eval_loss"] - step2["loss"]) / step2["loss"]
assert rel < 1e-5, (first, step2)
assert abs(first["eval_perplexity"] - math.exp(first["eval_loss"])) < 1e-9 * first["eval_perplexity"], first
assert first["eval_loss_chat.jsonl"] == first["eval_loss"], first  # one held-out file
print(f"eval_loss: {first['eval_loss']:.7f} after step 1 = step 2's training loss {step2['loss']:.7f} "
      f"(relative difference {rel:.1e}); perplexity {first['eval_perplexity']:.4f}")
PY
grep -q "eval: held-out loss [0-9.]* (perplexity [0-9.]*) over [0-9]* answer tokens" "$WORK/train.log" ||
  { cat "$WORK/train.log"; fail "no held-out loss in the report"; }
