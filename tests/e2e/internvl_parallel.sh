# InternVL under every parallel layout, through `loom run` over Gloo, against one process: the tiny
# InternVL of configs/shapes-internvl-tiny.yaml (a 2-block InternViT, the pixel-shuffle projector, a
# 3-block Qwen2 language model; 20 fp32 steps of packed shapes questions, 4 micro-batches a step) on
# dp=2, ZeRO-1 dp=2, FSDP (ZeRO-3) dp=2, tp=2 with sequence parallelism, pp=2 with the vision tower on
# a stage of its own, and cp=2 (a ring over the language model's tokens; each cp rank runs the whole
# vision tower). Each gives the single-process loss at every step within 1e-5 relative and, saved
# whole whatever the layout, the single process's step-20 weights within 1e-5.
source "$(dirname "$0")/lib.bash"
JOB="$SRC/configs/shapes-internvl-tiny.yaml"
common=(--set training.steps=20 --set training.global_batch_size=16 --set training.warmup_steps=2
        --set training.save_every=20 --set training.keep_last=1 --set training.threads=1
        --set tools.log_every=1 --set data.eval_samples=20 --set training.eval_every=0
        --set tools.progress_bar=false)
"$LOOM" train "$JOB" "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/one" \
  > "$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "single-process run"; }
run() {  # name, ranks, options
  local name=$1 ranks=$2
  shift 2
  "$LOOM" run -n "$ranks" -- "$LOOM" train "$JOB" "${common[@]}" --set training.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name run"; }
}
run dp2 2 --set training.micro_batch_size=4
run zero1_dp2 2 --set training.micro_batch_size=4 --set parallel.zero=1
run fsdp_dp2 2 --set training.micro_batch_size=4 --set parallel.zero=3
run tp2_sp 2 --set training.micro_batch_size=4 --set parallel.tp=2 --set parallel.sequence_parallel=true
run pp2_vision_stage 2 --set training.micro_batch_size=4 --set parallel.pp=2 \
  --set "model.pipeline_layers={vision_tower: [2, 0], llm: [0, 3]}"
run cp2 2 --set training.micro_batch_size=4 --set parallel.cp=2
grep -q "^\[rank 0\] .*ZeRO-1: 1/2 of the master weights and moments" "$WORK/zero1_dp2.log" ||
  { cat "$WORK/zero1_dp2.log"; fail "zero1: not sharded"; }
grep -q "^\[rank 0\] .*(FSDP: 1/2 of every trainable parameter" "$WORK/fsdp_dp2.log" ||
  { cat "$WORK/fsdp_dp2.log"; fail "fsdp: not sharded"; }
grep -q "^\[rank 0\] .*pipeline parallelism (pp=2, 1f1b): model.pipeline_layers: {vision_tower: \[2, 0\], llm: \[0, 3\]}; this rank (pipeline rank 0) runs vision_tower.embeddings to multi_modal_projector" \
  "$WORK/pp2_vision_stage.log" || { cat "$WORK/pp2_vision_stage.log"; fail "pp=2: no vision-only stage"; }
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from runs import steps, tensors
one = steps(f"{work}/one/metrics.jsonl")
w1 = tensors(f"{work}/one/step-00000020/model.safetensors")
assert sorted(one) == list(range(1, 21)), sorted(one)
for name in ("dp2", "zero1_dp2", "fsdp_dp2", "tp2_sp", "pp2_vision_stage", "cp2"):
    other = steps(f"{work}/{name}/metrics.jsonl")
    assert sorted(other) == list(range(1, 21)), (name, sorted(other))
    worst = max(abs(one[s]["loss"] - other[s]["loss"]) / abs(one[s]["loss"]) for s in other)
    w = tensors(f"{work}/{name}/step-00000020/model.safetensors")
    assert sorted(w) == sorted(w1), (name, sorted(set(w) ^ set(w1)))
    diff = max(abs(x - y) for k in w1 for x, y in zip(w[k], w1[k]))
    print(f"internvl {name} vs one process: max relative loss difference {worst:.3e} over 20 steps, "
          f"max absolute step-20 weight difference {diff:.3e}")
    assert worst <= 1e-5, (name, worst)
    assert diff <= 1e-5, (name, diff)
PY
echo "internvl: dp=2, ZeRO-1, FSDP, tp=2+SP, pp=2 (vision-only stage) and cp=2 match one process"
