# Context parallelism across real processes through `loom run`.
# 1. The attention alone: the gtest cases ContextAttentionUnderLoomRun (Ulysses, ring and their hybrid
#    at cp 4 and cp 2 against flash attention over the whole sequence, forward and backward; the ring
#    of 4 on 1, 127 and 4096 tokens) in 4 ranks.
# 2. Training the tiny shapes job (packed samples of uneven lengths, images through the vision tower;
#    10 fp32 steps) against one process: cp 2 as a ring and as Ulysses, cp 4 as a ring, as 2 x 2
#    hybrid and as Ulysses (a 4-head vision tower, against its own single process), cp 2 x dp 2,
#    cp 2 x tp 2 with sequence parallelism, unpacked rows, and Qwen2.5-VL's window attention at cp 2
#    and 2 x 2: the loss at every step within 1e-5 relative, the step-10 gradients within 1e-5; cp 2
#    with ZeRO-1, with FSDP and under pp 2: the losses and the step-10 weights within 1e-5.
# 3. Dynamic context parallelism (each step's degree from its longest sample) against one process.
# 4. The one-line errors: a Ulysses degree the heads do not split over, cp not dividing the world, a
#    sample longer than dynamic context parallelism's largest degree holds.
source "$(dirname "$0")/lib.bash"
TESTS=$(dirname "$LOOM")/loom_nn_tests
"$LOOM" run -n 4 -- "$TESTS" --gtest_filter='ContextAttentionUnderLoomRun.*' > "$WORK/run.log" 2>&1 ||
  { cat "$WORK/run.log"; fail "a rank failed"; }
for rank in 0 1 2 3; do
  for test in ContextAttentionUnderLoomRun.UlyssesRingAndHybridAreTheWholeAttention \
      ContextAttentionUnderLoomRun.RingOfFourOnSequencesOf1And127And4096Tokens \
      ContextAttentionUnderLoomRun.RowsLayoutsAreTheWholeAttention; do
    grep -q "^\[rank $rank\] \[       OK \] $test" "$WORK/run.log" ||
      { cat "$WORK/run.log"; fail "rank $rank did not pass $test (or skipped it)"; }
  done
done
echo "context attention: Ulysses, ring and hybrid at cp 4 and cp 2 match flash attention over the whole sequence, forward and backward"

common=(--set training.steps=10 --set training.global_batch_size=16 --set training.warmup_steps=2
        --set training.save_every=0 --set training.threads=1 --set tools.log_every=1 --set tools.dump_gradients=10)
one() {  # name, options: the single-process reference
  local name=$1
  shift
  small_job "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name: single process"; }
}
one one
parallel_run cp2_ring 2 --set parallel.cp=2
parallel_run cp2_ulysses 2 --set parallel.cp=2 --set parallel.cp_ulysses=2
parallel_run cp4_ring 4 --set parallel.cp=4
parallel_run cp4_hybrid 4 --set parallel.cp=4 --set parallel.cp_ulysses=2
parallel_run cp2_dp2 4 --set parallel.cp=2
parallel_run cp2_tp2_sp 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
# ZeRO-1 and FSDP shard the gradients, and pipeline stages keep theirs: their step-10 weights are
# compared instead. Under pp each stage splits its micro-batches' tokens over its own cp group (the
# vision tower and one LLM block on the first stage, the other two blocks on the second; then a vision
# block on each stage, their carry the sharded vision rows, under Ulysses).
parallel_run cp2_dp2_zero1 4 --set parallel.cp=2 --set parallel.zero=1 --set tools.dump_gradients=0
parallel_run cp2_fsdp 2 --set parallel.cp=2 --set parallel.zero=3 --set tools.dump_gradients=0
parallel_run cp2_pp2 4 --set parallel.cp=2 --set parallel.pp=2 --set tools.dump_gradients=0
parallel_run cp2_pp2_vision_stages 4 --set parallel.cp=2 --set parallel.cp_ulysses=2 --set parallel.pp=2 \
  --set "model.pipeline_layers={visual: [1, 1], llm: [0, 3]}" --set tools.dump_gradients=0
VISION4=(--set model.hf_config.vision_config.num_heads=4)
one one_vision4 "${VISION4[@]}"
parallel_run cp4_ulysses 4 --set parallel.cp=4 --set parallel.cp_ulysses=4 "${VISION4[@]}"
one one_unpacked --set data.packing=false
parallel_run cp2_unpacked 2 --set parallel.cp=2 --set data.packing=false
# Qwen2.5-VL: window attention in vision block 0 (windows of one merge unit), full attention in block 1.
python3 - "$SRC/configs/shapes-qwen2vl-tiny.yaml" "$WORK/qwen25.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
start, end = text.index("    vision_config:"), text.index("data:")
vision = '''    vision_config: {depth: 2, hidden_size: 64, out_hidden_size: 128, intermediate_size: 128, num_heads: 2,
      in_channels: 3, patch_size: 14, spatial_merge_size: 2, temporal_patch_size: 2, hidden_act: silu,
      window_size: 28, fullatt_block_indexes: [1]}
'''
text = text[:start] + vision + text[end:]
text = text.replace("family: qwen2_vl", "family: qwen2_5_vl").replace("model_type: qwen2_vl", "model_type: qwen2_5_vl")
open(sys.argv[2], "w").write(text)
PY
"$LOOM" train "$WORK/qwen25.yaml" "${common[@]}" --set training.micro_batch_size=4 --set data.eval_samples=50 \
  --set tools.progress_bar=false --set training.eval_every=0 --set training.output_dir="$WORK/one_qwen25" \
  > "$WORK/one_qwen25.log" 2>&1 || { cat "$WORK/one_qwen25.log"; fail "Qwen2.5-VL, one process"; }
for run in "qwen25_cp2 2" "qwen25_cp4_hybrid 4 --set parallel.cp_ulysses=2"; do
  set -- $run
  name=$1 ranks=$2
  shift 2
  "$LOOM" run -n "$ranks" -- "$LOOM" train "$WORK/qwen25.yaml" "${common[@]}" --set training.micro_batch_size=4 \
    --set data.eval_samples=50 --set tools.progress_bar=false --set training.eval_every=0 \
    --set parallel.cp="$ranks" --set training.output_dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; fail "$name"; }
done
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import runs
pairs = {"cp2_ring": "one", "cp2_ulysses": "one", "cp4_ring": "one", "cp4_hybrid": "one", "cp2_dp2": "one",
         "cp2_tp2_sp": "one", "cp4_ulysses": "one_vision4", "cp2_unpacked": "one_unpacked",
         "qwen25_cp2": "one_qwen25", "qwen25_cp4_hybrid": "one_qwen25"}
for name, reference in pairs.items():
    loss, count, diff = runs.compare(work, name, reference, 10, "gradients/step-00000010.safetensors")
    print(f"{name}: 10 losses within {loss:.1e} relative of one process, step-10 gradients of {count} tensors within {diff:.1e}")
for name in ("cp2_dp2_zero1", "cp2_fsdp", "cp2_pp2", "cp2_pp2_vision_stages"):
    loss, count, diff = runs.compare(work, name, "one", 10, "step-00000010/model.safetensors")
    print(f"{name}: 10 losses within {loss:.1e} relative of one process, step-10 weights of {count} tensors within {diff:.1e}")
PY
# Dynamic context parallelism on conversations whose lengths vary 8x (39 to 322 tokens, an image in every
# third), 4 a step: at 84 tokens a rank, a step runs as dp 4 (every sample within 84 tokens), as two
# groups of cp 2 (within 168) or as cp 4 (a 2 x 2 hybrid here); at cp 2 x dp 2 and 168 tokens a rank,
# as dp 4 or as two rings of 2.
python3 - "$WORK/dynamic" <<'PY'
import json, os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
words = ["red", "blue", "green", "square", "circle", "small", "large", "left", "right", "top"]
rows = []
for i in range(48):
    n = [1, 12, 2, 50, 3, 1, 2, 1, 3, 30, 2, 8][i % 12]  # reply words
    reply = " ".join(words[(i * 7 + j) % len(words)] for j in range(n))
    row = {"messages": [{"role": "system", "content": "S"},
                        {"role": "user", "content": ("<image>" if i % 3 == 0 else "") + f"Item {i}?"},
                        {"role": "assistant", "content": reply}]}
    if i % 3 == 0:
        row["images"] = ["images/red.png"]
    rows.append(json.dumps(row))
open(f"{out}/train.jsonl", "w").write("\n".join(rows) + "\n")
PY
cat > "$WORK/dynamic/job.yaml" <<YAML
$(tiny_chat_model)
data:
  dataset: messages
  tokenizer: $SRC/tests/fixtures/conversations/chatml_bpe_tokenizer.json
  datasets: [{path: $WORK/dynamic/train.jsonl, root: $SRC/tests/fixtures/conversations}]
  max_pixels: 3136
  packing: true
training:
  steps: 10
  global_batch_size: 4
  micro_batch_size: 2
  warmup_steps: 2
  save_every: 0
  eval_every: 0
  threads: 1
tools: {progress_bar: false, log_every: 1, dump_gradients: 10}
YAML
dynamic_run() {  # name, ranks, options
  local name=$1 ranks=$2
  shift 2
  "$LOOM" run -n "$ranks" -- "$LOOM" train "$WORK/dynamic/job.yaml" --set training.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name"; }
}
dynamic_run dynamic_one 1
dynamic_run dynamic_cp4 4 --set parallel.cp=4 --set parallel.cp_ulysses=2 --set parallel.dynamic_cp=true \
  --set parallel.dynamic_cp_tokens=84
dynamic_run dynamic_cp2_dp2 4 --set parallel.cp=2 --set parallel.dynamic_cp=true --set parallel.dynamic_cp_tokens=168
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import runs
for name, degrees in (("dynamic_cp4", {1, 2, 4}), ("dynamic_cp2_dp2", {1, 2})):
    loss, count, diff = runs.compare(work, name, "dynamic_one", 10, "gradients/step-00000010.safetensors")
    picked = [runs.steps(f"{work}/{name}/metrics.jsonl")[s]["cp"] for s in range(1, 11)]
    assert set(picked) == degrees, (name, picked)
    print(f"{name}: steps at cp {picked}: 10 losses within {loss:.1e} relative of one process, step-10 gradients of {count} tensors within {diff:.1e}")
PY
# A sample longer than the largest degree holds: a one-line error naming the step and the sample.
if "$LOOM" run -n 2 -- "$LOOM" train "$WORK/dynamic/job.yaml" --set parallel.cp=2 --set parallel.dynamic_cp=true \
    --set parallel.dynamic_cp_tokens=100 --set training.output_dir="$WORK/dynamic_long" > "$WORK/bad.log" 2>&1; then
  fail "accepted a sample longer than parallel.cp x parallel.dynamic_cp_tokens"
fi
grep -qE "loom: error: step [0-9]+: sample [0-9] of its 4 holds [0-9]+ tokens, more than parallel.cp=2 ranks hold at parallel.dynamic_cp_tokens=100 each \(200 tokens\); raise either, or lower data.max_seq_len" \
  "$WORK/bad.log" || { cat "$WORK/bad.log"; fail "no one-line error for a sample longer than dynamic cp allows"; }
# The one-line errors, before any work.
for bad in "4 --set parallel.cp=4 --set parallel.cp_ulysses=4|parallel.cp_ulysses=4 does not split the attention heads per tensor-parallel rank (llm 4, its key/value heads 2, vision 2) evenly over the Ulysses ranks" \
           "4 --set parallel.cp=3|parallel.dp=auto: world size 4 is not divisible by tp*cp*pp = 1*3*1 = 3"; do
  args=${bad%%|*} message=${bad#*|}
  set -- $args
  ranks=$1
  shift
  if "$LOOM" run -n "$ranks" -- "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" "$@" > "$WORK/bad.log" 2>&1; then
    fail "accepted: $args"
  fi
  grep -qF "$message" "$WORK/bad.log" || { cat "$WORK/bad.log"; fail "no one-line error for $args"; }
done
echo "context parallel training: every layout gives the single-process losses and gradients; bad degrees are one-line errors"
