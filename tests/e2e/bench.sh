# loom bench: one JSON object as the last line of its output, with rates, the median step time, MFU,
# peak memory and a time split whose shares lie in [0, 1] and sum to at most 1; nothing is written
# to the job's output directory. Under loom run -n 2 rank 0 alone prints it. Values are checked
# for sense only: timings are machine-dependent and never asserted.
source "$(dirname "$0")/lib.bash"
"$LOOM" bench "$SRC/configs/shapes-qwen2vl-tiny.yaml" --steps 4 --warmup 1 \
  --set training.output_dir="$WORK/out" --set training.threads=2 > "$WORK/one.log" 2>&1 ||
  { cat "$WORK/one.log"; fail "loom bench"; }
[ ! -e "$WORK/out" ] || fail "loom bench wrote to the output directory"
"$LOOM" run -n 2 -- "$LOOM" bench "$SRC/configs/shapes-qwen2vl-tiny.yaml" --steps 3 --warmup 1 \
  --set training.micro_batch_size=32 --set training.output_dir="$WORK/out" > "$WORK/two.log" 2>&1 ||
  { cat "$WORK/two.log"; fail "loom bench under loom run -n 2"; }
[ "$(grep -c '"tokens_per_s"' "$WORK/two.log")" -eq 1 ] || { cat "$WORK/two.log"; fail "not exactly one report"; }
python3 - "$WORK/one.log" "$WORK/two.log" <<'PY'
import json, sys
for path, ranks in ((sys.argv[1], 1), (sys.argv[2], 2)):
    line = [l for l in open(path) if '"tokens_per_s"' in l][-1]
    r = json.loads(line[line.index("{"):])
    assert r["steps"] in (3, 4) and r["warmup"] == 1 and r["data_parallel_ranks"] == ranks, r
    for key in ("tokens_per_s", "samples_per_s", "step_time_median_s", "mfu", "sgemm_gflops", "peak_rss_mib", "time_s"):
        assert r[key] > 0, (key, r)
    shares = [part["share"] for part in r["time_split"].values()]
    assert sorted(r["time_split"]) == ["backward", "communication", "data", "forward", "optimizer"], r
    assert all(0 <= s <= 1 for s in shares) and sum(shares) <= 1.0 + 1e-9, r
    assert r["time_split"]["forward"]["s"] > 0 and r["time_split"]["backward"]["s"] > 0, r
    print(f"{ranks} rank(s): {r['tokens_per_s']:.0f} tokens/s, median step {r['step_time_median_s']*1e3:.0f} ms, "
          f"mfu {r['mfu']:.2f}, peak rss {r['peak_rss_mib']:.0f} MiB")
PY
echo "bench: one JSON report per run, sensible fields, nothing written"
