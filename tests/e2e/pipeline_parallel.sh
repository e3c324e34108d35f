# Pipeline parallelism through `loom run` over Gloo, against the single-process run of the tiny
# shapes job (2 vision blocks, 3 LLM blocks, tied embeddings; 20 fp32 steps, 4 packed micro-batches
# a step): pp=2 (1F1B), pp=2 with GPipe, pp=4, pp=2 with 2 virtual stages (interleaved 1F1B), pp=2 x
# tp=2 with sequence parallelism, pp=2 x dp=2 with ZeRO-1 and with FSDP, a stage with only vision blocks beside a
# stage with none, and an uneven split with the vision tower over both stages. Each gives the
# single-process loss at every step within 1e-5 relative and its step-20 weights (gathered whole
# from the stages) within 1e-5. Recompute in the bubbles (pp=4, and pp=2 x 2 virtual stages) and full
# recompute with offload inside the stages give the plain pipeline's numbers bit for bit. Checkpoints
# are the single process's tensors; the pp=2 x tp=2
# checkpoint of step 10 resumes at pp=1 and at pp=4 with the same step-11 loss. Packed conversations
# with 0 to 2 images each train under pp=2 as in one process, and a Qwen2.5-VL (window attention) at
# pp=3 with a stage per vision block as in one process. Then the one-line
# errors: a list whose sum is not the tower's blocks, a stage with no blocks, pp not dividing the
# world, more virtual stages than blocks.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=20 --set training.global_batch_size=16 --set training.warmup_steps=2
        --set training.save_every=10 --set training.threads=1 --set tools.log_every=1)
small_job "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/one" \
  > "$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "single-process run"; }
parallel_run pp2 2 --set parallel.pp=2
parallel_run pp2_gpipe 2 --set parallel.pp=2 --set parallel.pipeline_schedule=gpipe
parallel_run pp4 4 --set parallel.pp=4
parallel_run pp2_v2 2 --set parallel.pp=2 --set parallel.virtual_stages=2
parallel_run pp2_tp2 4 --set parallel.pp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
parallel_run pp2_dp2_zero1 4 --set parallel.pp=2 --set parallel.zero=1
parallel_run pp2_dp2_fsdp 4 --set parallel.pp=2 --set parallel.zero=3
parallel_run vision_stage 2 --set parallel.pp=2 --set "model.pipeline_layers={visual: [2, 0], llm: [0, 3]}"
parallel_run uneven 2 --set parallel.pp=2 --set "model.pipeline_layers={visual: [1, 1], llm: [0, 3]}"
# Recompute in the bubbles, and the memory features inside the stages: the plain runs' numbers bit for bit.
parallel_run pp4_bubbles 4 --set parallel.pp=4 --set features.recompute_in_bubbles=true
parallel_run pp2_v2_bubbles 2 --set parallel.pp=2 --set parallel.virtual_stages=2 --set features.recompute_in_bubbles=true
parallel_run pp2_offload 2 --set parallel.pp=2 --set features.recompute=full --set features.offload=true
grep -q "^\[rank 0\] .*pipeline parallelism (pp=2, 1f1b): model.pipeline_layers: {visual: \[2, 0\], llm: \[0, 3\]}; this rank (pipeline rank 0) runs visual.patch_embed to visual.merger" \
  "$WORK/vision_stage.log" || { cat "$WORK/vision_stage.log"; fail "no pipeline line for the vision-only stage"; }
# Conversations with 0, 1 and 2 images, packed 2 to a micro-batch: the micro-batches differ in length
# and image count (a micro-batch without images has its vision stage hand on an empty carry), under pp=2
# with the vision tower on a stage of its own, against one process.
FIX="$SRC/tests/fixtures/conversations"
cat > "$WORK/mixed.jsonl" <<'JSONL'
{"messages": [{"role": "user", "content": "<image>Shape?"}, {"role": "assistant", "content": "square"}], "images": ["images/red.png"]}
{"messages": [{"role": "user", "content": "<image><image>Same?"}, {"role": "assistant", "content": "no, one is blue"}], "images": ["images/grey.png", "images/sky.jpg"]}
{"messages": [{"role": "user", "content": "Say ok."}, {"role": "assistant", "content": "ok"}]}
{"messages": [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hello!"}]}
{"messages": [{"role": "system", "content": "Short answers."}, {"role": "user", "content": "Sky<image>"}, {"role": "assistant", "content": "blue"}], "images": ["images/sky.jpg"]}
{"messages": [{"role": "user", "content": "<image>Tone?"}, {"role": "assistant", "content": "grey"}], "images": ["images/grey.png"]}
{"messages": [{"role": "user", "content": "<image><image>Which is red?"}, {"role": "assistant", "content": "the first"}], "images": ["images/red.png", "images/grey.png"]}
{"messages": [{"role": "user", "content": "Count to two."}, {"role": "assistant", "content": "one two"}]}
JSONL
cat > "$WORK/mixed.yaml" <<YAML
$(tiny_chat_model 2)
data:
  dataset: messages
  tokenizer: $FIX/chatml_bpe_tokenizer.json
  datasets: [{path: $WORK/mixed.jsonl, root: $FIX}]
  eval_samples: 1
  max_pixels: 3136
  packing: true
training: {steps: 10, global_batch_size: 8, micro_batch_size: 2, lr: 3.0e-3, warmup_steps: 2, threads: 1, save_every: 0}
tools: {progress_bar: false, log_every: 1}
YAML
"$LOOM" train "$WORK/mixed.yaml" --set training.output_dir="$WORK/mixed_one" > "$WORK/mixed_one.log" 2>&1 ||
  { cat "$WORK/mixed_one.log"; fail "mixed images, one process"; }
"$LOOM" run -n 2 -- "$LOOM" train "$WORK/mixed.yaml" --set training.output_dir="$WORK/mixed_pp2" --set parallel.pp=2 \
  --set "model.pipeline_layers={visual: [2, 0], llm: [0, 2]}" > "$WORK/mixed_pp2.log" 2>&1 ||
  { cat "$WORK/mixed_pp2.log"; fail "mixed images, pp=2"; }
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import runs
a, b = runs.steps(f"{work}/mixed_one/metrics.jsonl"), runs.steps(f"{work}/mixed_pp2/metrics.jsonl")
assert sorted(a) == sorted(b) == list(range(1, 11)), (sorted(a), sorted(b))
loss = max(abs(a[s]["loss"] - b[s]["loss"]) / a[s]["loss"] for s in a)
assert loss <= 1e-5, loss
mine = runs.tensors(f"{work}/mixed_pp2/step-00000010/model.safetensors")
theirs = runs.tensors(f"{work}/mixed_one/step-00000010/model.safetensors")
weights = max(max(abs(x - y) for x, y in zip(mine[k], theirs[k])) for k in mine)
assert weights <= 1e-5, weights
print(f"mixed images (0-2 per sample, packed): 10 losses within {loss:.1e} relative, step-10 weights within {weights:.1e}")
PY
# Qwen2.5-VL: the tiny job with a Qwen2.5-VL vision tower (window attention in block 0, windows of one
# merge unit; full attention in block 1), its two blocks on stages of their own (pp=3 and pp=2).
python3 - "$SRC/configs/shapes-qwen2vl-tiny.yaml" "$WORK/qwen25.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.index("    vision_config:")
end = text.index("data:")
vision = '''    vision_config: {depth: 2, hidden_size: 64, out_hidden_size: 128, intermediate_size: 128, num_heads: 2,
      in_channels: 3, patch_size: 14, spatial_merge_size: 2, temporal_patch_size: 2, hidden_act: silu,
      window_size: 28, fullatt_block_indexes: [1]}
'''
text = text[:start] + vision + text[end:]
text = text.replace("family: qwen2_vl", "family: qwen2_5_vl").replace("model_type: qwen2_vl", "model_type: qwen2_5_vl")
open(sys.argv[2], "w").write(text)
PY
"$LOOM" train "$WORK/qwen25.yaml" "${common[@]}" --set training.steps=10 --set training.micro_batch_size=4 \
  --set data.eval_samples=50 --set tools.progress_bar=false --set training.eval_every=0 \
  --set training.output_dir="$WORK/qwen25_one" > "$WORK/qwen25_one.log" 2>&1 || { cat "$WORK/qwen25_one.log"; fail "Qwen2.5-VL, one process"; }
"$LOOM" run -n 3 -- "$LOOM" train "$WORK/qwen25.yaml" "${common[@]}" --set training.steps=10 --set training.micro_batch_size=4 \
  --set data.eval_samples=50 --set tools.progress_bar=false --set training.eval_every=0 --set parallel.pp=3 \
  --set "model.pipeline_layers={visual: [1, 1, 0], llm: [0, 0, 3]}" --set training.output_dir="$WORK/qwen25_pp3" \
  > "$WORK/qwen25_pp3.log" 2>&1 || { cat "$WORK/qwen25_pp3.log"; fail "Qwen2.5-VL, pp=3"; }
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import runs
a, b = runs.steps(f"{work}/qwen25_one/metrics.jsonl"), runs.steps(f"{work}/qwen25_pp3/metrics.jsonl")
assert sorted(a) == sorted(b) == list(range(1, 11)), (sorted(a), sorted(b))
loss = max(abs(a[s]["loss"] - b[s]["loss"]) / a[s]["loss"] for s in a)
assert loss <= 1e-5, loss
mine = runs.tensors(f"{work}/qwen25_pp3/step-00000010/model.safetensors")
theirs = runs.tensors(f"{work}/qwen25_one/step-00000010/model.safetensors")
weights = max(max(abs(x - y) for x, y in zip(mine[k], theirs[k])) for k in mine)
assert weights <= 1e-5, weights
print(f"Qwen2.5-VL at pp=3 (a stage per vision block): 10 losses within {loss:.1e} relative, step-10 weights within {weights:.1e}")
PY
# Headers and gradient buffers are reused from micro-batch to micro-batch and step to step.
grep -qE "^\[rank 0\] .*pipeline: [0-9.]+ s waited for the other stages in [0-9.]+ s of steps; [1-9][0-9]* header and gradient buffers reused" \
  "$WORK/pp4.log" || { cat "$WORK/pp4.log"; fail "no reused pipeline buffers"; }
# The step-10 checkpoint of pp=2 x tp=2, resumed at pp=1 and at pp=4.
mkdir -p "$WORK/resumed_pp1" "$WORK/resumed_pp4"
cp -r "$WORK/pp2_tp2/step-00000010" "$WORK/resumed_pp1/"
cp -r "$WORK/pp2_tp2/step-00000010" "$WORK/resumed_pp4/"
small_job "${common[@]}" --set training.micro_batch_size=4 --set training.steps=11 \
  --set training.output_dir="$WORK/resumed_pp1" > "$WORK/resumed_pp1.log" 2>&1 ||
  { cat "$WORK/resumed_pp1.log"; fail "resume at pp=1"; }
parallel_run resumed_pp4 4 --set parallel.pp=4 --set training.steps=11
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import runs
one = runs.steps(f"{work}/one/metrics.jsonl")
assert sorted(one) == list(range(1, 21)), sorted(one)
theirs = runs.tensors(f"{work}/one/step-00000020/model.safetensors")
for name in ("pp2", "pp2_gpipe", "pp4", "pp2_v2", "pp2_tp2", "pp2_dp2_zero1", "pp2_dp2_fsdp", "vision_stage",
             "uneven"):
    run = runs.steps(f"{work}/{name}/metrics.jsonl")
    assert sorted(run) == list(range(1, 21)), (name, sorted(run))
    loss = max(abs(run[s]["loss"] - one[s]["loss"]) / one[s]["loss"] for s in run)
    assert loss <= 1e-5, (name, loss)
    mine = runs.tensors(f"{work}/{name}/step-00000020/model.safetensors")
    assert sorted(mine) == sorted(theirs), name
    weights = max(max(abs(a - b) for a, b in zip(mine[k], theirs[k])) for k in mine)
    assert weights <= 1e-5, (name, weights)
    for f in ("model.safetensors", "optimizer.safetensors"):
        assert runs.shapes(f"{work}/{name}/step-00000010/{f}") == runs.shapes(f"{work}/one/step-00000010/{f}"), (name, f)
    print(f"{name}: 20 losses within {loss:.1e} relative, step-20 weights within {weights:.1e}")
for name, plain in (("pp4_bubbles", "pp4"), ("pp2_v2_bubbles", "pp2_v2"), ("pp2_offload", "pp2")):
    a, b = runs.steps(f"{work}/{plain}/metrics.jsonl"), runs.steps(f"{work}/{name}/metrics.jsonl")
    assert sorted(b) == list(range(1, 21)) and all(a[s]["loss"] == b[s]["loss"] for s in a), name
    x = runs.raw(f"{work}/{plain}/step-00000020/model.safetensors")
    y = runs.raw(f"{work}/{name}/step-00000020/model.safetensors")
    assert x == y, name
    print(f"{name}: 20 losses and the step-20 weights equal to {plain}'s")
after = {name: runs.steps(f"{work}/{name}/metrics.jsonl") for name in ("resumed_pp1", "resumed_pp4")}
for name, run in after.items():
    assert sorted(run) == [11], (name, sorted(run))
    # Step 11's loss is the step-10 weights' (the update follows it): the uninterrupted run's.
    assert abs(run[11]["loss"] - one[11]["loss"]) <= 1e-5 * one[11]["loss"], (name, run[11]["loss"], one[11]["loss"])
assert abs(after["resumed_pp1"][11]["loss"] - after["resumed_pp4"][11]["loss"]) <= 1e-6 * one[11]["loss"], after
print(f"pp=2 x tp=2 checkpoint of step 10: step-11 loss {after['resumed_pp1'][11]['loss']:.7f} at pp=1, "
      f"{after['resumed_pp4'][11]['loss']:.7f} at pp=4 (uninterrupted one process: {one[11]['loss']:.7f})")
PY

refused() {  # name, ranks, expected error line (a prefix), options...
  local name=$1 ranks=$2 want=$3
  shift 3
  set +e
  "$LOOM" run -n "$ranks" -- "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" "${common[@]}" \
    --set training.micro_batch_size=4 --set training.output_dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1
  local code=$?
  set -e
  [ "$code" -ne 0 ] || fail "$name was accepted"
  grep -qE "^(\[rank [0-9]+\] )?loom: error: $want" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "no one-line error for $name"; }
}
refused bad_sum 2 "model.pipeline_layers.llm: \\[1, 1\\] sums to 2, but the model has 3 llm blocks" \
  --set parallel.pp=2 --set "model.pipeline_layers={visual: [2, 0], llm: [1, 1]}"
refused empty_stage 2 "model.pipeline_layers: stage 1 holds no blocks of any tower \\(visual, llm\\); every stage needs one" \
  --set parallel.pp=2 --set "model.pipeline_layers={visual: [2, 0], llm: [3, 0]}"
refused recompute_layers 2 "features.recompute_layers: 2 is more than the 1 blocks of the smallest pipeline stage \\(model.pipeline_layers: \\{visual: \\[2, 0\\], llm: \\[2, 1\\]\\}\\)" \
  --set parallel.pp=2 --set "model.pipeline_layers={visual: [2, 0], llm: [2, 1]}" --set features.recompute=full \
  --set features.recompute_layers=2
refused world 3 ".*parallel.dp=auto: world size 3 is not divisible by tp\\*cp\\*pp = 1\\*1\\*2 = 2" --set parallel.pp=2
refused virtual 2 ".*parallel.pp=2 x parallel.virtual_stages=3 = 6 pipeline stages exceeds the model's 5 blocks" \
  --set parallel.pp=2 --set parallel.virtual_stages=3
echo "pipeline parallelism: 1F1B, GPipe, interleaved, pp x tp, pp x dp with ZeRO-1 and uneven cuts match one process"
