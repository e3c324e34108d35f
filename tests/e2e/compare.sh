# bench/compare on the tiny shapes job: Loom and the PyTorch reference, transformers' Qwen2-VL with
# SDPA attention on packed rows (the torch and transformers of the python3 on the PATH, the project
# virtualenv's), load the same initial weights and train the same exported batches; the script
# itself fails unless their losses agree within 1e-4 for 5 steps. Here: it succeeds, the losses it
# printed agree to 1e-5, and its last line is one JSON object with the ratios and figures, each
# positive. Speeds are machine-dependent and never asserted.
# The same for the built-in video job's DiT against bench/reference/wan_eager.py, its VAE an inline
# random one (bench/compare extracts the clips' latents and captions first).
source "$(dirname "$0")/lib.bash"
"$SRC/bench/compare" "$SRC/configs/shapes-qwen2vl-tiny.yaml" --loom "$LOOM" --rounds 1 --steps 2 --warmup 1 \
  --threads 1 --set training.micro_batch_size=32 > "$WORK/compare.log" 2>&1 ||
  { cat "$WORK/compare.log"; fail "bench/compare"; }
"$SRC/bench/compare" "$SRC/configs/wan-moving-fashion.yaml" --loom "$LOOM" --rounds 1 --steps 2 --warmup 1 \
  --threads 1 --set training.global_batch_size=4 --set training.micro_batch_size=2 --set data.features= \
  --set 'model.vae={dim: 8, z_dim: 4, dim_mult: [1, 2, 2], num_res_blocks: 1, attn_scales: [],
    temperal_downsample: [true, true], latents_mean: [0, 0, 0, 0],
    latents_std: [1, 1, 1, 1]}' > "$WORK/compare-wan.log" 2>&1 ||
  { cat "$WORK/compare-wan.log"; fail "bench/compare (Wan)"; }
for log in compare compare-wan; do
python3 - "$WORK/$log.log" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
steps = re.findall(r"agreement step (\d): loom loss ([0-9.]+), reference loss ([0-9.]+)", text)
assert [int(s) for s, _, _ in steps] == [1, 2, 3, 4, 5], text
for _, a, b in steps:
    assert abs(float(a) - float(b)) <= 1e-5 * float(b), (a, b)
r = json.loads(text.strip().splitlines()[-1])
for key in ("tokens_per_s_ratio", "peak_memory_ratio", "loom_mfu", "sgemm_gflops", "loom_tokens_per_s",
            "reference_tokens_per_s", "loom_peak_rss_mib", "reference_peak_rss_mib"):
    assert r[key] > 0, (key, r)
assert r["max_loss_rel_diff_5_steps"] <= 1e-4, r
print(f"compare: agree to {r['max_loss_rel_diff_5_steps']:.1e}; tokens/s ratio {r['tokens_per_s_ratio']:.2f}, "
      f"peak memory ratio {r['peak_memory_ratio']:.2f}")
PY
done
echo "compare: Loom and the PyTorch references (Qwen2-VL, Wan DiT) agree; the report has every field"
