# A rank that stops (SIGSTOP: its sockets stay open, so no collective fails) no longer hangs the job
# for parallel.timeout_s: the other ranks end once its heartbeat has stood still for
# parallel.heartbeat_timeout_s, naming it and the collective they waited in, and `loom run` stops
# the stopped rank too. Rank 1 stopped (rank 0 sees its counter stand still) and rank 0 stopped (it
# hosts the store: rank 1's heartbeat rounds stop being answered). A short heartbeat timeout keeps
# the test quick; the issue's figure (the default 60 s) is measured by hand.
source "$(dirname "$0")/lib.bash"
for stopped in 1 0; do
  rm -rf "$WORK/run"
  "$LOOM" run -n 2 -- "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.steps=100000 \
    --set training.global_batch_size=8 --set training.micro_batch_size=4 --set training.save_every=0 \
    --set tools.progress_bar=false --set tools.log_every=1 --set training.output_dir="$WORK/run" \
    --set parallel.heartbeat_timeout_s=6 > "$WORK/run.log" 2>&1 &
  launcher=$!
  for _ in $(seq 600); do grep -q "step 2/" "$WORK/run.log" 2>/dev/null && break; sleep 0.5; done
  grep -q "step 2/" "$WORK/run.log" || { cat "$WORK/run.log"; kill -9 $launcher; fail "the 2-rank run did not start"; }
  victim=""
  for pid in $(pgrep -P $launcher); do
    grep -qz "^RANK=$stopped$" "/proc/$pid/environ" && victim=$pid
  done
  [ -n "$victim" ] || { kill -9 $launcher; fail "no process of rank $stopped"; }
  kill -STOP "$victim"
  # Bounded only so that a regression fails instead of hanging CI (parallel.timeout_s is 300 s).
  for _ in $(seq 240); do kill -0 $launcher 2>/dev/null || break; sleep 0.5; done
  if kill -0 $launcher 2>/dev/null; then
    kill -9 $launcher "$victim" 2>/dev/null || true
    cat "$WORK/run.log"
    fail "the job still runs 120 s after rank $stopped was stopped"
  fi
  set +e
  wait $launcher
  code=$?
  set -e
  [ "$code" -ne 0 ] || { cat "$WORK/run.log"; fail "loom run exited 0 with rank $stopped stopped"; }
  kill -0 "$victim" 2>/dev/null && { kill -9 "$victim"; fail "the stopped rank $stopped outlived loom run"; }
  survivor=$((1 - stopped))
  if [ "$stopped" = 1 ]; then
    want="loom: error: rank 0: lost rank 1: heartbeat stopped [0-9]* s ago (parallel.heartbeat_timeout_s 6): a stopped, hung or disconnected process"
  else
    want="loom: error: rank 1: lost rank 0: the rendezvous store it hosts has not answered for [0-9]* s (parallel.heartbeat_timeout_s 6): a stopped, hung or disconnected process"
  fi
  grep -q "^\[rank $survivor\] $want" "$WORK/run.log" ||
    { cat "$WORK/run.log"; fail "rank $survivor did not name the stopped rank $stopped"; }
  grep -h "loom: error\|loom run:" "$WORK/run.log"
done
echo "stopped rank: the other rank named it within parallel.heartbeat_timeout_s, and loom run ended"
