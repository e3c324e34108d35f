#!/usr/bin/env bash
# Context parallelism's figures: `loom bench` of one 8192-token sample (a long conversation of the
# messages format, a 4-layer 256-wide Qwen2-VL, fp32) at cp 1, cp 2 and cp 4 as a ring, cp 4 as
# Ulysses and as 2 x 2 hybrid, all ranks on this machine. MODEL=qwen3_5: a 4-layer 256-wide Qwen3.5
# instead (three Gated DeltaNet layers, then full attention), at cp 1, 2 and 4 as a ring. Prints a Markdown table: each layout's
# largest per-rank activations (what a rank's forward keeps for its backward, loom bench's
# allocator count) and their ratio to cp 1's, the step time, and, for the ring, the seconds it spent
# computing, blocked on messages after its compute, and what the same messages take alone, with
# the hidden share 1 - blocked / alone. Last line: one JSON object of those figures. A measurement,
# not a test: never run by ctest.
#   bash bench/context.sh [--set key=value ...]
# Knobs: LOOM (binary, default build/loom), STEPS (2 timed), WARMUP (1), MODEL (qwen2_vl or qwen3_5),
# LENGTH (the sample's tokens, 8192).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
STEPS=${STEPS:-2}
WARMUP=${WARMUP:-1}
MODEL=${MODEL:-qwen2_vl}
LENGTH=${LENGTH:-8192}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 - "$WORK/long.jsonl" <<'PY'
import json, random, sys
words = "the a red blue green square circle triangle left right top bottom one two three shape color of is and in".split()
with open(sys.argv[1], "w") as f:
    for seed in range(4):  # each longer than 8192 tokens, truncated to LENGTH
        random.seed(seed)
        answer = " ".join(random.choice(words) for _ in range(6000))
        f.write(json.dumps({"messages": [{"role": "user", "content": "Describe the scene."},
                                         {"role": "assistant", "content": answer}]}) + "\n")
PY
model_qwen3_5() {
  cat <<YAML
model:
  family: qwen3_5
  hf_config:
    model_type: qwen3_5
    vision_start_token_id: 263
    vision_end_token_id: 264
    image_token_id: 265
    video_token_id: 266
    tie_word_embeddings: true
    text_config:
      vocab_size: 268
      hidden_size: 256
      intermediate_size: 512
      num_hidden_layers: 4
      layer_types: [linear_attention, linear_attention, linear_attention, full_attention]
      num_attention_heads: 8
      num_key_value_heads: 4
      head_dim: 32
      linear_num_key_heads: 4
      linear_num_value_heads: 8
      linear_key_head_dim: 32
      linear_value_head_dim: 32
      linear_conv_kernel_dim: 4
      rope_parameters: {rope_type: default, rope_theta: 10000.0, partial_rotary_factor: 0.25,
                        mrope_section: [2, 1, 1], mrope_interleaved: true}
    vision_config: {depth: 1, hidden_size: 32, intermediate_size: 64, num_heads: 4, out_hidden_size: 256,
                    num_position_embeddings: 64}
YAML
}
model_qwen2_vl() {
  cat <<YAML
model:
  family: qwen2_vl
  hf_config:
    model_type: qwen2_vl
    vocab_size: 267
    hidden_size: 256
    intermediate_size: 512
    num_hidden_layers: 4
    num_attention_heads: 8
    num_key_value_heads: 4
    tie_word_embeddings: true
    rope_scaling: {type: mrope, mrope_section: [4, 6, 6]}
    vision_start_token_id: 263
    vision_end_token_id: 264
    image_token_id: 265
    video_token_id: 266
    vision_config: {depth: 1, embed_dim: 32, num_heads: 4, mlp_ratio: 2, hidden_size: 256}
YAML
}
cat > "$WORK/long.yaml" <<YAML
$(model_$MODEL)
data:
  dataset: messages
  tokenizer: $PWD/tests/fixtures/conversations/chatml_bpe_tokenizer.json
  datasets: [{path: $WORK/long.jsonl}]
  eval_samples: 1
  max_seq_len: $LENGTH
  overlong: truncate
  packing: true
training: {steps: 10, global_batch_size: 1, micro_batch_size: 1, lr: 1.0e-4, warmup_steps: 1, threads: 1}
YAML
layouts=("cp 1|1|" "cp 2, ring|2|--set parallel.cp=2" "cp 4, ring|4|--set parallel.cp=4")
[ "$MODEL" = qwen3_5 ] || layouts+=("cp 4, Ulysses|4|--set parallel.cp=4 --set parallel.cp_ulysses=4"
  "cp 4, 2 x 2 hybrid|4|--set parallel.cp=4 --set parallel.cp_ulysses=2")
for i in "${!layouts[@]}"; do
  IFS='|' read -r name ranks extra <<< "${layouts[$i]}"
  read -r -a options <<< "$extra"
  if [ "$ranks" = 1 ]; then
    "$LOOM" bench "$WORK/long.yaml" --steps "$STEPS" --warmup "$WARMUP" "$@" > "$WORK/$i.log" 2>&1
  else
    "$LOOM" run -n "$ranks" -- "$LOOM" bench "$WORK/long.yaml" --steps "$STEPS" --warmup "$WARMUP" \
      "${options[@]}" "$@" > "$WORK/$i.log" 2>&1
  fi || { cat "$WORK/$i.log"; echo "context: loom bench failed ($name)" >&2; exit 1; }
  echo "$name done" >&2
done
printf '%s\n' "${layouts[@]}" | cut -d'|' -f1 > "$WORK/names"
python3 - "$WORK" <<'PY'
import json, re, sys
work = sys.argv[1]
names = open(f"{work}/names").read().splitlines()
rows = []
for i, name in enumerate(names):
    lines = [l for l in open(f"{work}/{i}.log") if "{" in l and '"memory"' in l]
    result = json.loads(re.sub(r"^\[rank \d+\] ", "", lines[0]))
    context = result.get("context")
    per_rank = context["per_rank"] if context else [{"activations_mib": result["memory"]["activations_mib"]}]
    rows.append({"layout": name, "activations_mib": max(r["activations_mib"] for r in per_rank),
                 "step_s": result["step_time_median_s"],
                 "ring_compute_s": sum(r.get("ring_compute_s", 0) for r in per_rank) / len(per_rank),
                 "ring_wait_s": sum(r.get("ring_wait_s", 0) for r in per_rank) / len(per_rank),
                 "ring_alone_s": sum(r.get("ring_alone_s", 0) for r in per_rank) / len(per_rank),
                 "ring_hidden_share": context["ring_hidden_share"] if context and context["ring"] > 1 else None})
base = rows[0]["activations_mib"]
print("| layout | activations per rank (MiB) | vs cp 1 | step (s) | ring compute (s) | ring blocked (s) | messages alone (s) | hidden |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    r["activations_vs_cp1"] = r["activations_mib"] / base
    hidden = "" if r["ring_hidden_share"] is None else f"{r['ring_hidden_share']:.0%}"
    ring = r["ring_hidden_share"] is not None
    print(f"| {r['layout']} | {r['activations_mib']:.0f} | {r['activations_vs_cp1']:.2f} | {r['step_s']:.2f} | "
          + (f"{r['ring_compute_s']:.2f} | {r['ring_wait_s']:.2f} | {r['ring_alone_s']:.2f} | {hidden} |" if ring else "| | | |"))
print(json.dumps({r["layout"]: {k: v for k, v in r.items() if k != "layout"} for r in rows}))
PY
