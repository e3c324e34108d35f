#!/usr/bin/env bash
# How much of the data-parallel gradient all-reduce backward hides: the same job through
# `loom run -n RANKS`, with parallel.overlap_grad_reduce on (buckets start during backward) and off
# (every bucket after backward), alternating over ROUNDS rounds on this machine. Each step's
# grad_sync_s (metrics.jsonl) is the time the step waited for the all-reduce after backward; with
# overlap off that is the whole communication. Prints the medians and, as the last line, one JSON
# object with hidden_share = 1 - waited(on) / waited(off).
#   bash bench/overlap.sh [CONFIG] [--set key=value ...]
# Knobs: LOOM (binary, default build/loom), RANKS (2), ROUNDS (2), STEPS (30; the first 5 are
# warm-up and not counted), BUCKET_MB (4).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
RANKS=${RANKS:-2}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-30}
BUCKET_MB=${BUCKET_MB:-4}
CONFIG=configs/shapes-qwen2vl-tiny.yaml
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then CONFIG=$1; shift; fi
# By default a wider LLM (about 13M parameters, 52 MB of fp32 gradients) than the tiny job, so
# there is communication worth hiding.
if [ $# -eq 0 ] && [ "$CONFIG" = configs/shapes-qwen2vl-tiny.yaml ]; then
  set -- --set model.hf_config.hidden_size=512 --set model.hf_config.intermediate_size=1536 \
    --set model.hf_config.num_hidden_layers=4 --set model.hf_config.num_attention_heads=8 \
    --set model.hf_config.num_key_value_heads=4 --set model.hf_config.vision_config.hidden_size=512 \
    --set "model.hf_config.rope_scaling.mrope_section=[8,12,12]" \
    --set training.global_batch_size=32 --set training.micro_batch_size=8
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for round in $(seq "$ROUNDS"); do
  for mode in on off; do
    overlap=$([ "$mode" = on ] && echo true || echo false)
    out=$WORK/$mode-$round
    "$LOOM" run -n "$RANKS" -- "$LOOM" train "$CONFIG" "$@" --set training.steps="$STEPS" \
      --set training.save_every=0 --set training.eval_every=0 --set data.eval_samples=8 \
      --set training.warmup_steps=1 --set tools.progress_bar=false --set tools.log_every=1000 \
      --set parallel.bucket_mb="$BUCKET_MB" --set parallel.overlap_grad_reduce="$overlap" \
      --set training.output_dir="$out" > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
    grep -h "gradient all-reduce:" "$out.log" | sed "s/^/round $round, overlap $mode: /"
  done
done
python3 - "$WORK" "$ROUNDS" "$RANKS" "$BUCKET_MB" <<'PY'
import json, statistics, sys
work, rounds, ranks, bucket_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def per_step(mode):
    sync, step = [], []
    for r in range(1, rounds + 1):
        rows = [json.loads(line) for line in open(f"{work}/{mode}-{r}/metrics.jsonl")]
        rows = [row for row in rows if "grad_sync_s" in row and row["step"] > 5]
        sync += [row["grad_sync_s"] for row in rows]
        step += [row["step_time_s"] for row in rows]
    return statistics.median(sync), statistics.median(step)
on_sync, on_step = per_step("on")
off_sync, off_step = per_step("off")
print(f"waited for the all-reduce after backward, median per step: overlap on {on_sync * 1e3:.1f} ms, "
      f"off {off_sync * 1e3:.1f} ms; step time {on_step * 1e3:.0f} ms vs {off_step * 1e3:.0f} ms")
print(json.dumps({"ranks": ranks, "bucket_mb": bucket_mb, "rounds": rounds,
                  "grad_sync_s_overlap": round(on_sync, 5), "grad_sync_s_after_backward": round(off_sync, 5),
                  "hidden_share": round(1 - on_sync / off_sync, 3) if off_sync > 0 else None,
                  "step_time_ratio": round(on_step / off_step, 3)}))
PY
