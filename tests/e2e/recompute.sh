# Full and selective recompute (features.recompute) give the plain run's numbers bit for bit: the tiny
# shapes job, 20 fp32 steps, one process (every block, the first 3 of its 5 recomputed wholly, every
# block selectively, and every block wholly with its kept inputs offloaded), FSDP on 2 ranks and tensor parallelism with sequence parallelism on 2
# ranks (each wholly, selectively, and wholly with the kept inputs offloaded), against the same layout
# without recompute: equal losses at every step, equal step-1 gradients (tools.dump_gradients) where the
# layout can dump them, and equal step-20 weights. bf16 in one process too. Then the one-line errors:
# a recompute_layers above the model's block count, and a model without blocks (the Wan VAE).
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=20 --set training.global_batch_size=16 --set training.warmup_steps=2
        --set training.save_every=0 --set training.threads=1 --set tools.log_every=1)
one() {  # name, extra options...
  local name=$1
  shift
  small_job "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name run"; }
}
full=(--set features.recompute=full)
one one --set tools.dump_gradients=1
one one_full --set tools.dump_gradients=1 "${full[@]}"
one one_first3 --set tools.dump_gradients=1 "${full[@]}" --set features.recompute_layers=3
one one_selective --set tools.dump_gradients=1 --set features.recompute=selective
one one_offload --set tools.dump_gradients=1 "${full[@]}" --set features.offload=true
one bf16 --set training.precision=bf16
one bf16_full --set training.precision=bf16 "${full[@]}"
parallel_run fsdp 2 --set parallel.zero=3
parallel_run fsdp_full 2 --set parallel.zero=3 "${full[@]}"
parallel_run fsdp_selective 2 --set parallel.zero=3 --set features.recompute=selective
parallel_run fsdp_offload 2 --set parallel.zero=3 "${full[@]}" --set features.offload=true
parallel_run tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set training.micro_batch_size=8 \
  --set tools.dump_gradients=1
parallel_run tp2_sp_full 2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set training.micro_batch_size=8 \
  --set tools.dump_gradients=1 "${full[@]}"
parallel_run tp2_sp_selective 2 --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set training.micro_batch_size=8 --set tools.dump_gradients=1 --set features.recompute=selective
parallel_run tp2_sp_offload 2 --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set training.micro_batch_size=8 --set tools.dump_gradients=1 "${full[@]}" --set features.offload=true
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import os, sys
sys.path.insert(0, sys.argv[2])
import runs
work = sys.argv[1]
def same(plain, recomputed):
    a, b = runs.steps(f"{work}/{plain}/metrics.jsonl"), runs.steps(f"{work}/{recomputed}/metrics.jsonl")
    assert sorted(a) == sorted(b) == list(range(1, 21)), (recomputed, sorted(b))
    for s in a:
        assert a[s]["loss"] == b[s]["loss"], (recomputed, s, a[s]["loss"], b[s]["loss"])
    line = f"{recomputed}: 20 losses equal to {plain}'s"
    files = ["step-00000020/model.safetensors"]
    if os.path.exists(f"{work}/{plain}/gradients/step-00000001.safetensors"):
        files.append("gradients/step-00000001.safetensors")
    for f in files:
        x, y = runs.tensors(f"{work}/{plain}/{f}"), runs.tensors(f"{work}/{recomputed}/{f}")
        assert sorted(x) == sorted(y), (recomputed, f)
        unequal = [k for k in x if x[k] != y[k]]
        assert not unequal, (recomputed, f, unequal[:3])
        line += f", {f.split('/')[0]} {len(x)} tensors bit-identical"
    print(line)
same("one", "one_full")
same("one", "one_first3")
same("one", "one_selective")
same("one", "one_offload")
same("bf16", "bf16_full")
same("fsdp", "fsdp_full")
same("fsdp", "fsdp_selective")
same("fsdp", "fsdp_offload")
same("tp2_sp", "tp2_sp_full")
same("tp2_sp", "tp2_sp_selective")
same("tp2_sp", "tp2_sp_offload")
PY
grep -q "^.*recompute full: 3 of 5 blocks (visual.blocks.0 ... model.layers.0) keep only their inputs" \
  "$WORK/one_first3.log" || { cat "$WORK/one_first3.log"; fail "no recompute line"; }
grep -q "^.*offload: the recomputed blocks' inputs go to a spill file in " "$WORK/one_offload.log" ||
  { cat "$WORK/one_offload.log"; fail "no offload line"; }

set +e
small_job "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/bad" "${full[@]}" \
  --set features.recompute_layers=6 > "$WORK/bad.log" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] || fail "6 of 5 blocks was accepted"
set +e
grep -q "^loom: error: features.recompute_layers: 6 is more than the 5 blocks of this stage (visual.blocks.0 ... model.layers.2)$" \
  "$WORK/bad.log" || { cat "$WORK/bad.log"; fail "no one-line error for too many recompute layers"; }
"$LOOM" train "$SRC/configs/wan-moving-fashion-vae.yaml" --set training.output_dir="$WORK/vae" "${full[@]}" \
  > "$WORK/vae.log" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] || fail "recompute of a model without blocks was accepted"
grep -q "^loom: error: features.recompute: full recomputes the model's blocks, and this model has none" \
  "$WORK/vae.log" || { cat "$WORK/vae.log"; fail "no one-line error for a model without blocks"; }
echo "recompute: full (one process, first 3 blocks, bf16, FSDP, tp=2 with SP), selective and full with offload give the plain runs' numbers bit for bit"
