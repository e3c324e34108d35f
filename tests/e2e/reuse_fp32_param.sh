# The fp32 master weights held as the bf16 parameters and 16-bit residuals
# (features.reuse_fp32_param) give the separate fp32 master's numbers bit for bit: the tiny shapes
# job in bf16, 20 steps, in one process, at tp=2 (with sequence parallelism) and under ZeRO-1 on 2
# ranks, each against the same layout without it: equal losses at every step and equal step-20
# weights and optimizer state (the checkpoint's master.<name> entries are the joined fp32 masters),
# with 2 bytes less model state per trainable parameter (ZeRO-1: per element of the rank's slice). Then the one-line errors: fp32 training, and FSDP over ranks.
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=20 --set training.global_batch_size=16 --set training.warmup_steps=2
        --set training.save_every=0 --set training.threads=1 --set tools.log_every=1
        --set training.precision=bf16)
reuse=(--set features.reuse_fp32_param=true)
one() {  # name, extra options...
  local name=$1
  shift
  small_job "${common[@]}" --set training.micro_batch_size=4 --set training.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name run"; }
}
one one
one one_reuse "${reuse[@]}"
tp=(--set parallel.tp=2 --set parallel.sequence_parallel=true --set training.micro_batch_size=8)
parallel_run tp2 2 "${tp[@]}"
parallel_run tp2_reuse 2 "${tp[@]}" "${reuse[@]}"
parallel_run zero1 2 --set parallel.zero=1
parallel_run zero1_reuse 2 --set parallel.zero=1 "${reuse[@]}"
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import re, sys
sys.path.insert(0, sys.argv[2])
import runs
work = sys.argv[1]
def state_bytes(name):
    # "memory on this rank: trainable parameters P MiB, ...; model state per rank: N bytes"
    log = open(f"{work}/{name}.log").read()
    m = re.search(r"model state per rank: (\d+) bytes", log)
    assert m, name
    return int(m.group(1))
def same(plain, reused, params=None):
    a, b = runs.steps(f"{work}/{plain}/metrics.jsonl"), runs.steps(f"{work}/{reused}/metrics.jsonl")
    assert sorted(a) == sorted(b) == list(range(1, 21)), (reused, sorted(b))
    for s in a:
        assert a[s]["loss"] == b[s]["loss"], (reused, s, a[s]["loss"], b[s]["loss"])
    line = f"{reused}: 20 losses equal to {plain}'s"
    for f in ["model.safetensors", "optimizer.safetensors"]:
        x = runs.raw(f"{work}/{plain}/step-00000020/{f}")
        y = runs.raw(f"{work}/{reused}/step-00000020/{f}")
        assert sorted(x) == sorted(y), (reused, f)
        unequal = [k for k in x if x[k] != y[k]]
        assert not unequal, (reused, f, unequal[:3])
        line += f", {f} {len(x)} tensors bit-identical"
    if params is not None:
        saved = state_bytes(plain) - state_bytes(reused)
        assert saved == 2 * params, (reused, saved, params)
        line += f", {saved} bytes less model state per rank (2 for each of {params} master elements)"
    print(line)
optimizer = runs.raw(f"{work}/one/step-00000020/optimizer.safetensors")
params = sum(len(v[2]) // 4 for k, v in optimizer.items() if k.startswith("exp_avg."))
same("one", "one_reuse", params)
same("tp2", "tp2_reuse")
same("zero1", "zero1_reuse", (params + 1) // 2)  # each rank's slice of the flat parameters
PY
grep -q "(the fp32 master weights held as the bf16 parameters and 16-bit residuals)" "$WORK/one_reuse.log" ||
  { cat "$WORK/one_reuse.log"; fail "no memory line for the reused masters"; }

refused() {  # name, expected error line (a prefix), command...
  local name=$1 want=$2
  shift 2
  set +e
  "$@" > "$WORK/$name.log" 2>&1
  local code=$?
  set -e
  [ "$code" -ne 0 ] || fail "$name was accepted"
  grep -qE "^(\[rank [0-9]+\] )?loom: error: $want" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "no one-line error for $name"; }
}
refused fp32 "features.reuse_fp32_param: training.precision is fp32; the fp32 weights are the parameters" \
  small_job "${common[@]}" --set training.micro_batch_size=4 --set training.precision=fp32 \
  --set training.output_dir="$WORK/fp32" "${reuse[@]}"
refused zero3 "features.reuse_fp32_param: parallel.zero=3 \\(FSDP\\) holds each rank's slice of the fp32 master as the parameters" \
  "$LOOM" run -n 2 -- "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" "${common[@]}" \
  --set training.micro_batch_size=4 --set parallel.zero=3 --set training.output_dir="$WORK/zero3" "${reuse[@]}"
echo "reuse_fp32_param: one process, tp=2 and ZeRO-1 give the separate master's numbers bit for bit, 2 bytes less per parameter"
