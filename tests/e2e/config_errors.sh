# Bad configuration is a one-line error naming the key, with a non-zero exit code.
source "$(dirname "$0")/lib.bash"
expect_error() {
  local want=$1; shift
  local job="$SRC/configs/shapes-qwen2vl-tiny.yaml"
  [ "${1:-}" = --job ] && { job=$2; shift 2; }
  if "$LOOM" train "$job" --set training.output_dir="$WORK/run" "$@" \
      > "$WORK/out" 2> "$WORK/err"; then
    fail "expected an error for $*"
  fi
  [ "$(wc -l < "$WORK/err")" -eq 1 ] || { cat "$WORK/err"; fail "error for $* is not one line"; }
  grep -qF -- "$want" "$WORK/err" || { cat "$WORK/err"; fail "error for $* does not mention '$want'"; }
  echo "ok: $* -> $(cat "$WORK/err")"
}
expect_error "unknown key 'training.lrr'" --set training.lrr=0.1
expect_error "training.steps=many: expected an integer" --set training.steps=many
expect_error "parallel.tp=3" --set parallel.tp=3
expect_error "model.hf_config.image_token_id" --set model.hf_config.image_token_id=9
expect_error "model.freeze: 'vision'" --set "model.freeze=[vision]"
expect_error "training.task=dpo: 'dpo' is not one of vlm_sft" --set training.task=dpo
# Qwen3.5's layouts this version does not run.
expect_error "parallel.cp_ulysses=2: Qwen3.5's linear-attention layers" --job "$SRC/configs/shapes-qwen3_5-tiny.yaml" \
  --set parallel.cp=2 --set parallel.cp_ulysses=2
expect_error "parallel.vision_tp=2: Qwen3.5's vision tower is whole" --job "$SRC/configs/shapes-qwen3_5-tiny.yaml" \
  --set parallel.tp=2 --set parallel.vision_tp=2
# Expert parallelism: a model without experts, an ep that does not divide the experts, a layout
# this version does not run beside it.
expect_error "parallel.ep=2: this model has no experts" --set parallel.ep=2
expect_error "parallel.ep=3 does not divide the model's 8 experts" --job "$SRC/configs/shapes-qwen3_5-moe-tiny.yaml" \
  --set parallel.ep=3
expect_error "parallel.ep=2 with parallel.zero=3 and parallel.pp=2: expert parallelism under FSDP runs beside data" \
  --job "$SRC/configs/shapes-qwen3_5-moe-tiny.yaml" --set parallel.ep=2 --set parallel.zero=3 --set parallel.pp=2
# A CUDA job on a build whose libtorch has no CUDA: one line, before anything is built.
# (ldd's listing read whole first: grep -q stops early, and under pipefail ldd's broken pipe would
# read as "no libtorch_cuda".)
ldd "$LOOM" > "$WORK/ldd"
if ! grep -q libtorch_cuda "$WORK/ldd"; then
  expect_error "training.device=cuda: cuda needs Loom built against a CUDA libtorch; this build's libtorch is CPU-only" \
    --set training.device=cuda
fi
expect_error "training.allow_tf32=true: applies to CUDA's matrix products; training.device is cpu" \
  --set training.allow_tf32=true
cat > "$WORK/bad.yaml" <<'YAML'
model: {family: qwen2_vl, hf_config: /nonexistent/config.json}
training: {steps: 1}
YAML
if "$LOOM" train "$WORK/bad.yaml" 2> "$WORK/err"; then fail "missing hf_config file accepted"; fi
grep -qF "/nonexistent/config.json" "$WORK/err" || fail "missing file not named: $(cat "$WORK/err")"
echo "ok: missing model config file -> $(cat "$WORK/err")"
# A word that is no command is named as such, not reported as a missing command.
if "$LOOM" trian x.yaml 2> "$WORK/err"; then fail "unknown command accepted"; fi
grep -q "^loom: error: 'trian' is not a loom command; the commands are train, eval, bench, run, forward, shapes, export, chat, generate, data (loom --help)$" \
  "$WORK/err" || fail "unknown command: $(cat "$WORK/err")"
# --log-level is taken after the subcommand too.
"$LOOM" shapes qwen2-vl-2b --log-level warn > "$WORK/out" 2> "$WORK/err" || fail "--log-level after the subcommand: $(cat "$WORK/err")"
grep -q "^qwen2-vl-2b: [0-9]* parameters$" "$WORK/out" || fail "shapes output: $(cat "$WORK/out")"
echo "ok: unknown command named; --log-level after the subcommand"
