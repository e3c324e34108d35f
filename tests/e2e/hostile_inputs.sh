# Bad input from a hostile user is one line naming the file, key or sample, never a raw library
# message (std::bad_alloc, basic_filebuf::underflow, nlohmann's parse errors) or a hang; a warning
# where Loom can go on. Each case is a command that fails fast.
source "$(dirname "$0")/lib.bash"
job=("$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.output_dir="$WORK/run"
  --set tools.progress_bar=false --set training.threads=1 --set data.eval_samples=4)
# expect_error WANT ARGS...: ARGS fail with one error line, the last on stderr, which contains WANT
# (log lines may come before it).
expect_error() {
  local want=$1; shift
  if "$@" > "$WORK/out" 2> "$WORK/err"; then fail "expected an error from: $*"; fi
  [ "$(grep -c "loom: error" "$WORK/err")" -eq 1 ] || { cat "$WORK/err"; fail "not one error line from: $*"; }
  tail -n 1 "$WORK/err" | grep -q "^loom: error: " || { cat "$WORK/err"; fail "the error is not the last line: $*"; }
  tail -n 1 "$WORK/err" | grep -qF -- "$want" || { cat "$WORK/err"; fail "the error from $* does not say '$want'"; }
  echo "ok: $(tail -n 1 "$WORK/err")"
}

# The job file.
mkdir "$WORK/job.yaml"
expect_error "$WORK/job.yaml: cannot read the config file: it is a directory" "$LOOM" train "$WORK/job.yaml"
{
  echo "model: {family: qwen2_vl, hf_config: $SRC/configs/qwen2vl-tiny-config.json}"
  echo "training: {steps: 1}"
  echo "a: &a [x, x, x, x, x, x, x, x, x, x]"
  for n in b c d e f g h i; do
    p=$(printf "\\$(printf '%03o' $(( $(printf '%d' "'$n") - 1 )))")
    echo "$n: &$n [*$p, *$p, *$p, *$p, *$p, *$p, *$p, *$p, *$p, *$p]"
  done
} > "$WORK/bomb.yaml"
expect_error "bomb.yaml: expands to more than 100000 values" "$LOOM" train "$WORK/bomb.yaml"
# Counts that became threads, queue slots or allocations.
expect_error "data.num_workers=1000000: must be <= 256, got 1000000" "${job[@]}" --set data.num_workers=1000000
expect_error "data.prefetch=1000000000000: must be <= 4096, got 1000000000000" "${job[@]}" --set data.prefetch=1000000000000
expect_error "training.global_batch_size=4611686018427387904: must be <= 1048576, got 4611686018427387904" \
  "${job[@]}" --set training.global_batch_size=4611686018427387904
expect_error "data.eval_samples: 1000000000000 is more than the 100000 held-out samples of shapes_vqa" \
  "${job[@]}" --set data.eval_samples=1000000000000
expect_error "rms_norm_eps: must be > 0, got -1" "${job[@]}" --set model.hf_config.rms_norm_eps=-1
# training.threads far beyond the cores: a warning, and the job runs on 4 x the cores.
"${job[@]}" --set training.threads=4096 --set training.steps=1 > "$WORK/threads.log" 2>&1 ||
  { cat "$WORK/threads.log"; fail "training.threads=4096"; }
grep -q "training.threads: 4096 is more than 4 x the [0-9]* cores this process may run on; using" "$WORK/threads.log" ||
  { cat "$WORK/threads.log"; fail "no warning for training.threads=4096"; }
echo "ok: training.threads=4096 ran with a warning"

# A tokenizer path that is a directory.
mkdir "$WORK/tokenizer.json"
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n' > "$WORK/chat.jsonl"
cat > "$WORK/messages.yaml" <<YAML
model: {family: qwen2_vl, hf_config: $SRC/configs/qwen2vl-tiny-config.json}
data: {dataset: messages, tokenizer: $WORK/tokenizer.json, datasets: [{path: $WORK/chat.jsonl}]}
training: {steps: 1, output_dir: $WORK/messages}
YAML
expect_error "cannot read tokenizer file $WORK/tokenizer.json: it is a directory" "$LOOM" train "$WORK/messages.yaml"

# A run's checkpoints: trainer_state.json truncated, or naming another step than its directory's.
"${job[@]}" --set training.steps=2 --set training.save_every=1 > "$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "a two-step run"; }
state="$WORK/run/step-00000002/trainer_state.json"
head -c 20 "$state" > "$WORK/cut" && cp "$WORK/cut" "$state"
expect_error "training.resume: $WORK/run/step-00000002 cannot be resumed from: $state: not valid JSON" \
  "${job[@]}" --set training.steps=3 --set training.resume="$WORK/run/step-00000002"
# resume: auto passes over it to the newest complete checkpoint, and says so.
"${job[@]}" --set training.steps=3 > "$WORK/auto.log" 2>&1 || { cat "$WORK/auto.log"; fail "resume: auto"; }
grep -q "passing over checkpoint $WORK/run/step-00000002, which is incomplete: $state: not valid JSON" "$WORK/auto.log" ||
  { cat "$WORK/auto.log"; fail "resume: auto did not name the incomplete checkpoint"; }
grep -q "resumed from $WORK/run/step-00000001 at step 1" "$WORK/auto.log" ||
  { cat "$WORK/auto.log"; fail "resume: auto did not take the complete step-00000001"; }
echo "ok: resume: auto passed over the truncated step-00000002 to step-00000001"
python3 - "$WORK/run/step-00000003/trainer_state.json" <<'PY'
import json, sys
state = json.load(open(sys.argv[1]))
state["step"] = 1003
state["data_position"] = 1003 * state["global_batch_size"]
json.dump(state, open(sys.argv[1], "w"))
PY
expect_error "step 1003 disagrees with the directory's name step-00000003" \
  "${job[@]}" --set training.steps=4 --set training.resume="$WORK/run/step-00000003"
# init_from whose config.json disagrees with model.hf_config.
expect_error "num_hidden_layers is 3 there and 2 in model.hf_config" \
  "${job[@]}" --set model.init_from="$WORK/run/step-00000003" --set model.hf_config.num_hidden_layers=2 \
  --set training.output_dir="$WORK/other"
echo "hostile inputs: every error one line naming its file, key or sample"
