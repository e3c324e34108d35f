# One loom train per output_dir: while a run holds the directory's lock, a second run on it is
# refused with one line naming the first's pid (on every rank of a two-rank run, which must not
# hang), `loom train --check` and `loom bench` still work (they take no lock and write nothing),
# and once the first is killed with kill -9 the kernel has released its lock: a third run trains.
source "$(dirname "$0")/lib.bash"
run="$WORK/run"
job=("$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.threads=1 --set data.eval_samples=20
  --set tools.progress_bar=false --set training.eval_every=0 --set training.save_every=0
  --set training.output_dir="$run")

"${job[@]}" --set training.steps=100000 > "$WORK/first.log" 2>&1 &
first=$!
trap 'kill -9 "$first" 2>/dev/null || true; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
# The lock file names its holder once the lock is taken.
for _ in $(seq 600); do
  [ "$(cat "$run/.loom.lock" 2>/dev/null)" = "$first" ] && break
  kill -0 "$first" 2>/dev/null || { cat "$WORK/first.log"; fail "the first run ended early"; }
  sleep 0.1
done
[ "$(cat "$run/.loom.lock")" = "$first" ] || { cat "$WORK/first.log"; fail "the first run took no lock"; }
refusal="loom: error: training.output_dir: $run is in use by another loom train (pid $first); wait for it to end or choose another output directory"

if "${job[@]}" --set training.steps=2 > "$WORK/second.log" 2>&1; then
  cat "$WORK/second.log"
  fail "a second run on a directory in use was accepted"
fi
[ "$(tail -n 1 "$WORK/second.log")" = "$refusal" ] || { cat "$WORK/second.log"; fail "the second run's error"; }
[ "$(grep -c "loom: error" "$WORK/second.log")" -eq 1 ] || { cat "$WORK/second.log"; fail "not one error line"; }

# Two ranks started as torchrun would: rank 0 is refused, and rank 1 ends with rank 0's line.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ranks=()
for rank in 0 1; do
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    OMP_NUM_THREADS=1 "${job[@]}" --set training.steps=2 --set training.global_batch_size=8 \
    --set training.micro_batch_size=4 > "$WORK/rank$rank.log" 2>&1 &
  ranks+=($!)
done
for rank in 0 1; do
  set +e
  wait "${ranks[$rank]}"
  code=$?
  set -e
  [ "$code" -ne 0 ] || { cat "$WORK/rank$rank.log"; fail "rank $rank of a run on a directory in use exited 0"; }
  grep -Fxq "$refusal" "$WORK/rank$rank.log" || { cat "$WORK/rank$rank.log"; fail "rank $rank's error"; }
done

# Neither checking the job nor timing it touches the lock.
"${job[@]}" --check > "$WORK/check.log" 2>&1 || { cat "$WORK/check.log"; fail "loom train --check beside a run"; }
"$LOOM" bench "$SRC/configs/shapes-qwen2vl-tiny.yaml" --steps 1 --warmup 0 --set training.threads=1 \
  --set training.output_dir="$run" > "$WORK/bench.log" 2>&1 || { cat "$WORK/bench.log"; fail "loom bench beside a run"; }
[ "$(cat "$run/.loom.lock")" = "$first" ] || fail "the lock file no longer names the first run"

kill -9 "$first"
wait "$first" 2>/dev/null || true
# The file still names the killed run, but nothing holds its lock.
"${job[@]}" --set training.steps=2 > "$WORK/third.log" 2>&1 &
third=$!
wait "$third" || { cat "$WORK/third.log"; fail "a run after the holder was killed"; }
[ "$(cat "$run/.loom.lock")" = "$third" ] || fail "the third run did not take the lock"
[ -d "$run/step-00000002" ] || fail "the third run saved no checkpoint"
echo "run lock: a directory in use refused with the holder's pid (one rank and two), --check and bench beside it, free after kill -9"
