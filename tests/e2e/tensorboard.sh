# tools.tensorboard: every metrics.jsonl record is in the run's TensorBoard event files, read back
# by an independent reader (python3's protobuf over tests/fixtures/tensorboard/*.proto compiled here by
# protoc, its own CRC32C); a resumed run starts a new file, and what TensorBoard shows for a step
# run twice is the later run's, as in metrics.jsonl. Each run ends with a loss.png, decoded by zlib.
source "$(dirname "$0")/lib.bash"
command -v protoc > /dev/null && python3 -c "import google.protobuf" 2> /dev/null ||
  fail "needs protoc (Debian: protobuf-compiler) and python3's protobuf (bash scripts/setup.sh --oracles)"
mkdir -p "$WORK/proto"
protoc -I "$SRC/tests/fixtures/tensorboard" --python_out="$WORK/proto" event.proto summary.proto

common=(--set training.steps=4 --set training.global_batch_size=8 --set training.micro_batch_size=8
        --set training.save_every=2 --set training.peak_tflops=1 --set data.eval_samples=8
        --set tools.tensorboard=true --set training.output_dir="$WORK/run")
# Stops after step 3 (checkpoints 2 and 3); without checkpoint 3 the second run resumes from
# step 2 and runs step 3 again, as after a crash.
small_job "${common[@]}" --set training.exit_interval=3 > "$WORK/first.log" 2>&1 || { cat "$WORK/first.log"; fail "first run"; }
grep -q "wrote the loss curve to $WORK/run/loss.png" "$WORK/first.log" || fail "the first run wrote no loss.png"
rm -r "$WORK/run/step-00000003"
small_job "${common[@]}" > "$WORK/second.log" 2>&1 || { cat "$WORK/second.log"; fail "second run"; }
grep -q "resumed from .*step-00000002 at step 2" "$WORK/second.log" || fail "did not resume from step 2"
grep -q "TensorBoard events: $WORK/run/tensorboard/events.out.tfevents." "$WORK/second.log" ||
  fail "the event file is not named in the log"
python3 "$SRC/tests/e2e/tensorboard_reader.py" "$WORK/proto" "$WORK/run" 1,2,3
