# Shared helpers for the end-to-end tests: each test gets the loom binary and the source dir.
set -euo pipefail
LOOM=$1
SRC=$2
WORK=$(mktemp -d)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# The model section of the e2e tests' tiny Qwen2-VL for the ChatML BPE tokenizer of
# tests/fixtures/conversations (its 263 tokens, then the vision and image tokens), with a vision tower
# of $1 blocks (1 unless given); a job file takes it as $(tiny_chat_model) in an unquoted here-document.
tiny_chat_model() {
  cat <<YAML
model:
  family: qwen2_vl
  hf_config:
    model_type: qwen2_vl
    vocab_size: 267
    hidden_size: 64
    intermediate_size: 128
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    tie_word_embeddings: true
    rope_scaling: {type: mrope, mrope_section: [2, 3, 3]}
    vision_start_token_id: 263
    vision_end_token_id: 264
    image_token_id: 265
    video_token_id: 266
    vision_config: {depth: ${1:-1}, embed_dim: 32, num_heads: 2, mlp_ratio: 2, hidden_size: 64}
YAML
}
# A fast variant of the built-in tiny job for tests.
small_job() {
  "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" --set training.threads=2 --set data.eval_samples=50 \
    --set tools.progress_bar=false --set training.eval_every=0 "$@"
}
# The tiny job on several processes through `loom run`, with the calling test's `common` options:
# name (its output_dir is $WORK/name, its log $WORK/name.log), ranks, extra options.
parallel_run() {
  local name=$1 ranks=$2
  shift 2
  "$LOOM" run -n "$ranks" -- "$LOOM" train "$SRC/configs/shapes-qwen2vl-tiny.yaml" "${common[@]}" \
    --set data.eval_samples=50 --set tools.progress_bar=false --set training.eval_every=0 \
    --set training.micro_batch_size=4 --set training.output_dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; fail "$name run"; }
}
