# loom bench: one JSON object as the last line of its output, with rates, the median step time, MFU,
# peak memory and a time split whose shares lie in [0, 1] and sum to at most 1; nothing is written
# to the job's output directory. Under loom run -n 2 rank 0 alone prints it. Values are checked
# for sense only: timings are machine-dependent and never asserted. The memory split: parameters,
# gradients and optimizer state add up to the model state the log reports in bytes; activations
# and the allocated peak are counted (nonzero, the peak above the parameters and optimizer state),
# and full recompute leaves less than a fifth of the activations the plain run does. --profile writes a
# Chrome trace of the timed steps: operators with their times, inside Loom's step, forward, backward
# and optimizer ranges.
source "$(dirname "$0")/lib.bash"
"$LOOM" bench "$SRC/configs/shapes-qwen2vl-tiny.yaml" --steps 4 --warmup 1 \
  --set training.output_dir="$WORK/out" --set training.threads=2 > "$WORK/one.log" 2>&1 ||
  { cat "$WORK/one.log"; fail "loom bench"; }
[ ! -e "$WORK/out" ] || fail "loom bench wrote to the output directory"
"$LOOM" bench "$SRC/configs/shapes-qwen2vl-tiny.yaml" --steps 2 --warmup 1 --set features.recompute=full \
  --set training.output_dir="$WORK/out" --set training.threads=2 --profile "$WORK/trace.json" > "$WORK/full.log" 2>&1 ||
  { cat "$WORK/full.log"; fail "loom bench with full recompute"; }
"$LOOM" run -n 2 -- "$LOOM" bench "$SRC/configs/shapes-qwen2vl-tiny.yaml" --steps 3 --warmup 1 \
  --set training.micro_batch_size=32 --set training.output_dir="$WORK/out" > "$WORK/two.log" 2>&1 ||
  { cat "$WORK/two.log"; fail "loom bench under loom run -n 2"; }
[ "$(grep -c '"tokens_per_s"' "$WORK/two.log")" -eq 1 ] || { cat "$WORK/two.log"; fail "not exactly one report"; }
python3 - "$WORK/one.log" "$WORK/two.log" "$WORK/full.log" <<'PY'
import json, re, sys
def report(path):
    line = [l for l in open(path) if '"tokens_per_s"' in l][-1]
    return json.loads(line[line.index("{"):])
for path, ranks in ((sys.argv[1], 1), (sys.argv[2], 2)):
    r = report(path)
    memory = r["memory"]
    state = int(re.search(r"model state per rank: (\d+) bytes", open(path).read()).group(1))
    split = (memory["parameters_mib"] + memory["gradients_mib"] + memory["optimizer_mib"]) * 2**20
    assert abs(split - state) < 1, (split, state)
    assert memory["activations_mib"] > 0 and memory["peak_rss_mib"] == r["peak_rss_mib"], memory
    assert memory["peak_allocated_mib"] > memory["parameters_mib"] + memory["optimizer_mib"], memory
    assert r["steps"] in (3, 4) and r["warmup"] == 1 and r["data_parallel_ranks"] == ranks, r
    for key in ("tokens_per_s", "samples_per_s", "step_time_median_s", "mfu", "sgemm_gflops", "peak_rss_mib", "time_s"):
        assert r[key] > 0, (key, r)
    shares = [part["share"] for part in r["time_split"].values()]
    assert sorted(r["time_split"]) == ["backward", "communication", "data", "forward", "optimizer"], r
    assert all(0 <= s <= 1 for s in shares) and sum(shares) <= 1.0 + 1e-9, r
    assert r["time_split"]["forward"]["s"] > 0 and r["time_split"]["backward"]["s"] > 0, r
    print(f"{ranks} rank(s): {r['tokens_per_s']:.0f} tokens/s, median step {r['step_time_median_s']*1e3:.0f} ms, "
          f"mfu {r['mfu']:.2f}, peak rss {r['peak_rss_mib']:.0f} MiB, memory {memory}")
for path in sys.argv[1:]:
    r = report(path)
    assert r["device"] == "cpu" and "device_memory" not in r, r
plain, full = report(sys.argv[1])["memory"], report(sys.argv[3])["memory"]
assert full["activations_mib"] < 0.2 * plain["activations_mib"], (plain, full)
print(f"activations: {plain['activations_mib']:.2f} MiB, with full recompute {full['activations_mib']:.2f} MiB")
PY
python3 - "$WORK/trace.json" <<'PY'
import json, sys
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
spans = [e for e in events if e.get("ph") == "X"]
names = {e["name"] for e in spans}
for want in ("step 2", "step 3", "forward", "backward", "optimizer", "aten::mm"):
    assert want in names, (want, sorted(names)[:40])
assert "step 1" not in names, "the warm-up step was profiled"
assert all(e["dur"] >= 0 for e in spans) and sum(e["dur"] for e in spans if e["name"] == "aten::mm") > 0
print(f"profile: {len(spans)} spans, {len(names)} names; the timed steps' ranges and operators")
PY
# A mixture of experts at ep=2: every pick is computed once on some rank (dropless), so the ranks' rows
# add up to the picks the experts got; the grouped products and the exchanges are timed.
"$LOOM" run -n 2 -- "$LOOM" bench "$SRC/configs/shapes-qwen3_5-moe-tiny.yaml" --steps 1 --warmup 1 \
  --set parallel.ep=2 --set training.micro_batch_size=4 --set training.global_batch_size=8 --set training.threads=1 \
  > "$WORK/experts.log" 2>&1 || { cat "$WORK/experts.log"; fail "bench of a mixture of experts at ep=2"; }
python3 - "$WORK/experts.log" <<'PY' || fail "the experts' bench figures"
import json, sys
line = next(l for l in open(sys.argv[1]) if l.startswith("[rank 0] {"))
experts = json.loads(line[len("[rank 0] "):])["experts"]
ranks = experts["per_rank"]
assert experts["ep"] == 2 and len(ranks) == 2 and len(experts["expert_tokens"]) == 8, experts
assert sum(r["rows"] for r in ranks) == sum(experts["expert_tokens"]) > 0, experts
assert all(r["grouped_mm_s"] > 0 and r["exchange_mib"] > 0 and r["exchange_alone_s"] > 0 for r in ranks), ranks
assert 0 <= experts["exchange_hidden_share"] <= 1 and experts["grouped_mm_gflops"] > 0, experts
print(f"experts at ep=2: {sum(r['rows'] for r in ranks)} rows over the ranks, the experts' picks; "
      f"grouped GEMM {experts['grouped_mm_gflops']:.1f} GFLOP/s")
PY
echo "bench: one JSON report per run, sensible fields, nothing written but the requested profile"
