#!/usr/bin/env bash
# Expert parallelism's figures: `loom bench` of configs/shapes-qwen3_5-moe-tiny.yaml (8 experts, 2 a
# token, a shared expert) on 4 ranks of this machine, with small experts (the config's: hidden 128,
# expert width 96) and large ones (hidden 256, expert width 1024), each at ep 1 (EDP: every rank holds
# every expert and computes its own tokens' picks), ep 2 and ep 4; and ep 4 with hot-expert
# replication above 1.1. Prints a Markdown table: the step time, the experts' parameter bytes a rank
# holds, the grouped products' rate, the forward exchanges' blocked seconds against the same
# exchanges alone (the hidden share 1 - blocked / alone), and the most rows an ep rank computed over
# the mean. Last line: one JSON object of those figures. A measurement, not a test: never run by ctest.
#   bash bench/experts.sh [--set key=value ...]
# Knobs: LOOM (binary, default build/loom), STEPS (3 timed), WARMUP (1).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
STEPS=${STEPS:-3}
WARMUP=${WARMUP:-1}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
small=()
large=(--set model.hf_config.text_config.hidden_size=256 --set model.hf_config.text_config.moe_intermediate_size=1024
       --set model.hf_config.text_config.shared_expert_intermediate_size=1024
       --set model.hf_config.vision_config.out_hidden_size=256)
layouts=("small, ep 1 (EDP)|small|" "small, ep 2|small|--set parallel.ep=2" "small, ep 4|small|--set parallel.ep=4"
         "large, ep 1 (EDP)|large|" "large, ep 2|large|--set parallel.ep=2" "large, ep 4|large|--set parallel.ep=4"
         "large, ep 4, replication above 1.1|large|--set parallel.ep=4 --set parallel.hot_expert_threshold=1.1")
for i in "${!layouts[@]}"; do
  IFS='|' read -r name size extra <<< "${layouts[$i]}"
  read -r -a options <<< "$extra"
  declare -n sized=$size
  "$LOOM" run -n 4 -- "$LOOM" bench configs/shapes-qwen3_5-moe-tiny.yaml --steps "$STEPS" --warmup "$WARMUP" \
    --set training.micro_batch_size=16 --set training.threads=1 --set model.hf_config.text_config.output_router_logits=false \
    "${sized[@]}" "${options[@]}" "$@" > "$WORK/$i.log" 2>&1 ||
    { cat "$WORK/$i.log"; echo "experts: loom bench failed ($name)" >&2; exit 1; }
  echo "$name done" >&2
done
printf '%s\n' "${layouts[@]}" | cut -d'|' -f1 > "$WORK/names"
python3 - "$WORK" <<'PY'
import json, re, sys
work = sys.argv[1]
names = open(f"{work}/names").read().splitlines()
rows = []
for i, name in enumerate(names):
    lines = [l for l in open(f"{work}/{i}.log") if l.startswith("[rank 0] {") and '"memory"' in l]
    result = json.loads(re.sub(r"^\[rank \d+\] ", "", lines[0]))
    experts = result["experts"]
    per_rank = experts["per_rank"]
    held = [l for l in open(f"{work}/{i}.log") if l.startswith("[rank 0]") and "holds 1/" in l]
    expert_mib = float(re.search(r", (\d+) of their", held[0]).group(1)) / 2**20 if held else None
    ranks_rows = [r["rows"] for r in per_rank]
    rows.append({"layout": name, "step_s": result["step_time_median_s"], "expert_mib": expert_mib,
                 "grouped_mm_gflops": experts["grouped_mm_gflops"],
                 "blocked_s": sum(r["exchange_wait_s"] for r in per_rank) / len(per_rank),
                 "alone_s": sum(r["exchange_alone_s"] for r in per_rank) / len(per_rank),
                 "hidden_share": experts["exchange_hidden_share"] if len(per_rank) > 1 else None,
                 "rank_load": max(ranks_rows) / (sum(ranks_rows) / len(ranks_rows)) if len(per_rank) > 1 else None})
print("| layout | step (s) | expert weights per rank (MiB) | grouped GEMM (GFLOP/s) | exchange blocked (s) | alone (s) | hidden | ep rank load (most / mean rows) |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    ep = r["hidden_share"] is not None
    mib = "all" if r["expert_mib"] is None else f"{r['expert_mib']:.2f}"
    print(f"| {r['layout']} | {r['step_s']:.3f} | {mib} | {r['grouped_mm_gflops']:.1f} | "
          + (f"{r['blocked_s']:.3f} | {r['alone_s']:.3f} | {r['hidden_share']:.0%} | {r['rank_load']:.3f} |" if ep else "| | | |"))
print(json.dumps({r["layout"]: {k: v for k, v in r.items() if k != "layout"} for r in rows}))
PY
