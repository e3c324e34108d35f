# 2D layouts through `loom run` over Gloo: tensor parallelism composed with ZeRO-1 and with FSDP
# over the data-parallel ranks (tp=2 x dp=2 on 4 ranks), and tp=2 x FSDP with sequence
# parallelism, and tp=2 x FSDP x sequence parallelism over one kv head (replicated on both
# tensor-parallel ranks, its gradient summed over them on FSDP's shards), against the single-process
# run of the tiny shapes job (same seed and global batch, 20 fp32 steps; the one-kv-head run against
# its own): the loss at every step within 1e-5 relative and the step-20 weights within 1e-5.
# A tp=2 x FSDP checkpoint of step 10 resumes under tp=1 x ZeRO-1 (2 ranks) and in one process, each
# continuing with the 2D run's losses, and both the same as each other to 1e-5.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=20 --set training.global_batch_size=16 --set training.warmup_steps=2
        --set training.save_every=10 --set training.threads=1 --set tools.log_every=1)
small_job "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/one" \
  > "$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "single-process run"; }
parallel_run tp2_zero1 4 --set parallel.tp=2 --set parallel.zero=1
parallel_run tp2_zero3 4 --set parallel.tp=2 --set parallel.zero=3
parallel_run tp2_zero3_sp 4 --set parallel.tp=2 --set parallel.zero=3 --set parallel.sequence_parallel=true
small_job "${common[@]}" --set training.micro_batch_size=4 --set model.hf_config.num_key_value_heads=1 \
  --set training.output_dir="$WORK/one_kv1" > "$WORK/one_kv1.log" 2>&1 || { cat "$WORK/one_kv1.log"; fail "one_kv1"; }
parallel_run tp2_zero3_sp_kv1 4 --set parallel.tp=2 --set parallel.zero=3 --set parallel.sequence_parallel=true \
  --set model.hf_config.num_key_value_heads=1
grep -q "^\[rank 0\] .*FSDP: 1/2 of every trainable parameter" "$WORK/tp2_zero3.log" ||
  { cat "$WORK/tp2_zero3.log"; fail "no FSDP memory report under tp=2"; }
mkdir -p "$WORK/resumed_zero1" "$WORK/resumed_one"
cp -r "$WORK/tp2_zero3/step-00000010" "$WORK/resumed_zero1/"
cp -r "$WORK/tp2_zero3/step-00000010" "$WORK/resumed_one/"
parallel_run resumed_zero1 2 --set parallel.zero=1
small_job "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/resumed_one" \
  > "$WORK/resumed_one.log" 2>&1 || { cat "$WORK/resumed_one.log"; fail "resume in one process"; }
for name in resumed_zero1 resumed_one; do
  grep -q "resum.*step-00000010" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "no resume in $name"; }
done
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import runs
one = runs.steps(f"{work}/one/metrics.jsonl")
assert sorted(one) == list(range(1, 21)), sorted(one)
one_kv1 = runs.steps(f"{work}/one_kv1/metrics.jsonl")
def losses_within(name, reference, steps):
    return max(abs(name[s]["loss"] - reference[s]["loss"]) / reference[s]["loss"] for s in steps)
for name in ("tp2_zero1", "tp2_zero3", "tp2_zero3_sp", "tp2_zero3_sp_kv1"):
    reference = "one_kv1" if name.endswith("kv1") else "one"
    run = runs.steps(f"{work}/{name}/metrics.jsonl")
    assert sorted(run) == list(range(1, 21)), (name, sorted(run))
    loss = losses_within(run, one_kv1 if name.endswith("kv1") else one, range(1, 21))
    assert loss <= 1e-5, (name, loss)
    mine = runs.tensors(f"{work}/{name}/step-00000020/model.safetensors")
    theirs = runs.tensors(f"{work}/{reference}/step-00000020/model.safetensors")
    assert sorted(mine) == sorted(theirs), name
    assert all(len(mine[k]) == len(theirs[k]) for k in mine), name
    weights = max(max(abs(a - b) for a, b in zip(mine[k], theirs[k])) for k in mine)
    assert weights <= 1e-5, (name, weights)
    # The checkpoint holds the same names, dtypes and shapes as one process's (model and optimizer).
    for file in ("model.safetensors", "optimizer.safetensors"):
        assert runs.shapes(f"{work}/{name}/step-00000020/{file}") == runs.shapes(f"{work}/{reference}/step-00000020/{file}"), (name, file)
    print(f"{name}: steps 1-20 loss within {loss:.1e} relative; step-20 weights of {len(mine)} tensors within {weights:.1e}")
source = runs.steps(f"{work}/tp2_zero3/metrics.jsonl")
resumed = {name: runs.steps(f"{work}/{name}/metrics.jsonl") for name in ("resumed_zero1", "resumed_one")}
for name, run in resumed.items():
    assert sorted(run) == list(range(11, 21)), (name, sorted(run))
    loss = losses_within(run, source, range(11, 21))
    assert loss <= 1e-5, (name, loss)
    print(f"{name}: the tp=2 x FSDP checkpoint of step 10 continues with its losses (steps 11-20 within {loss:.1e}); "
          f"step 11 loss {run[11]['loss']:.7f}")
between = losses_within(resumed["resumed_zero1"], resumed["resumed_one"], range(11, 21))
assert between <= 1e-5, between
print(f"tp=1 x ZeRO-1 and one process after the same checkpoint: steps 11-20 within {between:.1e}")
PY
echo "tensor parallelism x ZeRO-1 and x FSDP (with and without sequence parallelism) match one process"
