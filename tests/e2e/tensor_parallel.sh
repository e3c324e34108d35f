# Tensor and sequence parallelism through `loom run` over Gloo, against the single-process run of
# the tiny shapes job (same seed and global batch, 20 fp32 steps; one process runs 4 micro-batches
# a step, the parallel runs 2 per rank): tp=2; tp=2 with sequence parallelism (packed rows whose
# length 2 does not always divide, so the padding path runs); tp=2 x dp=2 on 4 ranks; the vision
# tower whole (vision_tp=1) beside an LLM at tp=2, with and without sequence parallelism; tp=4
# over the LLM's 2 kv heads (each replicated on 2 ranks; the vision tower whole); one kv head at
# tp=2 with sequence parallelism (against a one-kv-head single process). Each gives the
# single-process loss at every step within 1e-5 relative, its step-1 gradients
# (tools.dump_gradients, gathered whole) within 1e-5 and its step-20 weights within 1e-4.
# Checkpoints: tp=2 writes the same tensor names, dtypes and shapes as tp=1 (model and optimizer
# state); a tp=2 checkpoint resumes at tp=1, and a tp=1 checkpoint at tp=2 with sequence
# parallelism, with the single-process losses after it; `loom forward` at tp=1 and at tp=2 on a
# tp=2 checkpoint gives the same logits, and at tp=2 on HuggingFace's tiny Qwen2-VL gives
# HuggingFace's logits. The per-rank parameter bytes of tp=2 are printed beside tp=1's.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=20 --set training.global_batch_size=16 --set training.warmup_steps=2
        --set training.save_every=10 --set training.threads=1 --set tools.log_every=1
        --set tools.dump_gradients=1)
small_job "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/one" \
  > "$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "single-process run"; }
parallel_run tp2 2 --set parallel.tp=2 --set training.micro_batch_size=8
parallel_run tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set training.micro_batch_size=8
parallel_run tp2_dp2 4 --set parallel.tp=2
parallel_run vision_tp1 2 --set parallel.tp=2 --set parallel.vision_tp=1 --set training.micro_batch_size=8
parallel_run vision_tp1_sp 2 --set parallel.tp=2 --set parallel.vision_tp=1 --set parallel.sequence_parallel=true \
  --set training.micro_batch_size=8
# tp=4 over the LLM's 2 kv heads: each kv head replicated on the 2 ranks whose query heads read it.
parallel_run tp4_kv_replicated 4 --set parallel.tp=4 --set parallel.vision_tp=1 --set training.micro_batch_size=8
# One kv head (multi-query attention) at tp=2 with sequence parallelism, against its own single process.
small_job "${common[@]}" --set training.micro_batch_size=4 --set model.hf_config.num_key_value_heads=1 \
  --set training.output_dir="$WORK/one_kv1" > "$WORK/one_kv1.log" 2>&1 || { cat "$WORK/one_kv1.log"; fail "one_kv1"; }
parallel_run tp2_sp_kv1 2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set training.micro_batch_size=8 \
  --set model.hf_config.num_key_value_heads=1
grep -q "^\[rank 0\] .*tensor parallelism (tp=2, sequence parallel): this rank holds" "$WORK/tp2_sp.log" ||
  { cat "$WORK/tp2_sp.log"; fail "no tensor-parallel memory report"; }
# The parameter count is the model's, not one rank's slices.
count=$(grep -o "training [0-9]* parameters ([0-9]* trainable)" "$WORK/one.log")
[ -n "$count" ] || { cat "$WORK/one.log"; fail "no parameter count"; }
grep -q "\[rank 0\] .*$count" "$WORK/tp4_kv_replicated.log" || { cat "$WORK/tp4_kv_replicated.log"; fail "tp=4 counts other than '$count'"; }
# Resumes across layouts: the tp=2 checkpoint of step 10 at tp=1, the tp=1 one at tp=2 + SP.
mkdir -p "$WORK/resumed_tp1" "$WORK/resumed_tp2_sp"
cp -r "$WORK/tp2/step-00000010" "$WORK/resumed_tp1/"
cp -r "$WORK/one/step-00000010" "$WORK/resumed_tp2_sp/"
small_job "${common[@]}" --set training.micro_batch_size=4 --set tools.dump_gradients=0 \
  --set training.output_dir="$WORK/resumed_tp1" > "$WORK/resumed_tp1.log" 2>&1 ||
  { cat "$WORK/resumed_tp1.log"; fail "resume at tp=1"; }
parallel_run resumed_tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set training.micro_batch_size=8 --set tools.dump_gradients=0
for name in resumed_tp1 resumed_tp2_sp; do
  grep -q "resum.*step-00000010" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "no resume in $name"; }
done
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import re, sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import runs
for name in ("tp2", "tp2_sp", "tp2_dp2", "vision_tp1", "vision_tp1_sp", "tp4_kv_replicated", "tp2_sp_kv1",
             "resumed_tp1", "resumed_tp2_sp"):
    reference = "one_kv1" if name.endswith("kv1") else "one"
    one = runs.steps(f"{work}/{reference}/metrics.jsonl")
    assert sorted(one) == list(range(1, 21)), sorted(one)
    grads = runs.tensors(f"{work}/{reference}/gradients/step-00000001.safetensors")
    run = runs.steps(f"{work}/{name}/metrics.jsonl")
    expected = range(11, 21) if name.startswith("resumed") else range(1, 21)
    assert sorted(run) == list(expected), (name, sorted(run))
    loss = max(abs(run[s]["loss"] - one[s]["loss"]) / one[s]["loss"] for s in expected)
    assert loss <= 1e-5, (name, loss)
    line = f"{name}: steps {expected[0]}-{expected[-1]} loss within {loss:.1e} relative"
    if not name.startswith("resumed"):
        theirs = runs.tensors(f"{work}/{name}/gradients/step-00000001.safetensors")
        assert sorted(theirs) == sorted(grads), name
        diff = max(max(abs(a - b) for a, b in zip(grads[k], theirs[k])) for k in grads)
        scale = max(max(abs(a) for a in g) for g in grads.values())
        assert all(len(theirs[k]) == len(grads[k]) for k in grads), name
        assert diff <= 1e-5, (name, diff)
        line += f"; step-1 gradients of {len(grads)} tensors within {diff:.1e} (largest gradient {scale:.2f})"
    # The weights each layout saved after step 20, gathered whole.
    mine = runs.tensors(f"{work}/{name}/step-00000020/model.safetensors")
    theirs = runs.tensors(f"{work}/{reference}/step-00000020/model.safetensors")
    assert sorted(mine) == sorted(theirs), name
    weights = max(max(abs(a - b) for a, b in zip(mine[k], theirs[k])) for k in mine)
    assert weights <= 1e-4, (name, weights)  # 20 Adam steps amplify summation-order differences
    line += f"; step-20 weights within {weights:.1e}"
    print(line)
# A tp=2 checkpoint is the same file set, names, dtypes and shapes as a tp=1 one.
for step in ("step-00000010", "step-00000020"):
    for file in ("model.safetensors", "optimizer.safetensors"):
        assert runs.shapes(f"{work}/tp2/{step}/{file}") == runs.shapes(f"{work}/one/{step}/{file}"), (step, file)
# Per-rank parameter bytes, tp=2 beside tp=1.
one_bytes = int(re.search(r"model state per rank: (\d+) bytes", open(f"{work}/one.log").read()).group(1))
m = re.search(r"\[rank 0\] .*tensor parallelism \(tp=2\): this rank holds (\d+) of the model's (\d+) trainable "
              r"parameter bytes \(([0-9.]+)x\); the split layers (\d+) of (\d+) \(([0-9.]+)x\)",
              open(f"{work}/tp2.log").read())
assert m, "no tp=2 memory line"
local, whole = int(m.group(1)), int(m.group(2))
assert whole * 4 == one_bytes, (whole, one_bytes)  # parameters + gradients + two moments, fp32
assert float(m.group(6)) == 0.5 and local < 0.75 * whole, m.groups()
print(f"parameter bytes per rank: tp=1 {whole}, tp=2 {local} ({local / whole:.3f}x); "
      f"split layers {m.group(4)} of {m.group(5)} (0.5x)")
PY
# loom forward: a tp=2 checkpoint at tp=1 and at tp=2 (same logits), HuggingFace's tiny model at tp=2.
FIX="$SRC/tests/fixtures/hf-qwen2-vl-tiny"
cp "$FIX/image.png" "$WORK/image.png"
# The shapes vocabulary: <|vision_start|> 3, <|image_pad|> 5, <|vision_end|> 4. The checkpoint's
# preprocessor_config.json holds the job's pixel bounds (56x56 = 3136 pixels at most), within which
# the 56x84 image is processed at 28x56: 2 tokens.
echo '{"input_ids": [[1, 3, 5, 5, 4, 9, 12, 17, 2]], "images": ["image.png"]}' > "$WORK/input.json"
python3 - "$FIX/input.json" "$WORK/hf_input.json" <<'PY'
import json, os, sys
src = json.load(open(sys.argv[1]))
json.dump({"input_ids": src["input_ids"], "images": [os.path.abspath(os.path.join(os.path.dirname(sys.argv[1]), "image.png"))]},
          open(sys.argv[2], "w"))
PY
"$LOOM" forward --model "$WORK/tp2/step-00000020" --input "$WORK/input.json" --out "$WORK/fwd_tp1" > /dev/null ||
  fail "forward at tp=1"
"$LOOM" run -n 2 -- "$LOOM" forward --model "$WORK/tp2/step-00000020" --input "$WORK/input.json" \
  --out "$WORK/fwd_tp2" > "$WORK/fwd_tp2.log" 2>&1 || { cat "$WORK/fwd_tp2.log"; fail "forward at tp=2"; }
"$LOOM" run -n 2 -- "$LOOM" forward --model "$FIX" --input "$WORK/hf_input.json" --out "$WORK/fwd_hf_tp2" \
  --sequence-parallel > "$WORK/fwd_hf.log" 2>&1 || { cat "$WORK/fwd_hf.log"; fail "forward of the HF model at tp=2"; }
python3 - "$WORK" "$SRC/tests/e2e" "$FIX" <<'PY'
import sys
work, fix = sys.argv[1], sys.argv[3]
sys.path.insert(0, sys.argv[2])
import runs
for name, a, b, bound in (("logits of a tp=2 checkpoint, tp=1 vs tp=2", f"{work}/fwd_tp1/logits.bin",
                           f"{work}/fwd_tp2/logits.bin", 1e-5),
                          ("HuggingFace's logits vs Loom's at tp=2 with sequence parallelism", f"{fix}/logits.bin",
                           f"{work}/fwd_hf_tp2/logits.bin", 1e-4),
                          ("HuggingFace's image embeddings vs Loom's at tp=2", f"{fix}/image_embeds.bin",
                           f"{work}/fwd_hf_tp2/image_embeds.bin", 1e-4)):
    x, y = runs.floats(a), runs.floats(b)
    assert len(x) == len(y) and len(x) > 0, name
    diff = max(abs(p - q) for p, q in zip(x, y))
    assert diff <= bound, (name, diff)
    print(f"{name}: {len(x)} values, max abs difference {diff:.1e}")
PY
echo "tensor parallelism: tp=2, tp=2 + SP, tp=2 x dp=2, vision tp=1 beside LLM tp=2 match one process"
