# A rank lost under a launcher other than `loom run` (here: the variables torchrun sets, as three
# background processes): the survivors' collectives fail, and each names the lost rank from the
# heartbeats in the store, and exits non-zero within 60 s instead of waiting out parallel.timeout_s;
# under plain data parallelism and under FSDP (whose collectives run inside backward's hooks and on
# a thread of their own).
source "$(dirname "$0")/lib.bash"
for layout in "parallel.zero=0" "parallel.zero=3"; do
  rm -rf "$WORK/run"
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  pids=()
  for rank in 0 1 2; do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      OMP_NUM_THREADS=1 "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.steps=100000 \
      --set training.global_batch_size=12 --set training.micro_batch_size=4 --set training.threads=1 \
      --set tools.progress_bar=false --set tools.log_every=1 --set training.save_every=0 \
      --set training.output_dir="$WORK/run" --set "$layout" > "$WORK/rank$rank.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 600); do grep -q "step 2/" "$WORK/rank0.log" 2>/dev/null && break; sleep 0.5; done
  grep -q "step 2/" "$WORK/rank0.log" || { cat "$WORK"/rank*.log; fail "the 3-rank run did not start"; }
  kill -9 "${pids[1]}"
  for rank in 0 2; do
    # Each survivor must end by itself well before parallel.timeout_s (300 s).
    for _ in $(seq 120); do kill -0 "${pids[$rank]}" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "${pids[$rank]}" 2>/dev/null; then
      kill -9 "${pids[0]}" "${pids[2]}" 2>/dev/null || true
      cat "$WORK/rank$rank.log"
      fail "rank $rank still runs 60 s after rank 1 was killed"
    fi
    set +e
    wait "${pids[$rank]}"
    code=$?
    set -e
    [ "$code" -ne 0 ] || fail "rank $rank exited 0 after losing rank 1"
    grep -q "loom: error: rank $rank: .* failed (.*); lost rank 1 (heartbeat stopped)" "$WORK/rank$rank.log" ||
      { cat "$WORK/rank$rank.log"; fail "rank $rank did not name the lost rank 1 (it exited with code $code)"; }
  done
  grep -h "loom: error" "$WORK/rank0.log" "$WORK/rank2.log"
done
echo "lost rank: ranks 0 and 2 named rank 1 and exited, with and without FSDP"
