# The built-in video job end to end, shrunk: the Wan VAE of configs/wan-moving-fashion-vae.yaml trains
# a few steps, then the DiT of configs/wan-moving-fashion.yaml trains on its latents; each under one
# process, data parallelism over two ranks, ZeRO-1 and FSDP (and the DiT under tensor, pipeline and
# context parallelism over two ranks, and cp 2 x pp 2 over four) and the DiT with full recompute (alone and with offload) and selective recompute, with the one-process losses (1e-5 relative: only the
# summation order over ranks differs). The DiT's evaluation samples a held-out
# caption into PNG frames, a GIF and an MP4, and loom generate makes the same clip for the same seed.
source "$(dirname "$0")/lib.bash"
shrink=(--set tools.progress_bar=false --set tools.log_every=1 --set data.eval_samples=4 --set data.num_workers=0
  --set training.global_batch_size=4 --set training.micro_batch_size=2 --set training.warmup_steps=0
  --set training.save_every=0)
vae=("$SRC/configs/wan-moving-fashion-vae.yaml" "${shrink[@]}" --set training.steps=4 --set training.eval_videos=1)
dit=("$SRC/configs/wan-moving-fashion.yaml" "${shrink[@]}" --set training.steps=4 --set model.vae="$WORK/vae"
  --set training.eval_videos=1 --set training.sample_steps=3 --set data.features=)

# train NAME RANKS CONFIG ARGS...: one process (RANKS 1) or RANKS through loom run; output_dir $WORK/NAME.
train() {
  local name=$1 ranks=$2
  shift 2
  local command=("$LOOM" train "$@" --set training.output_dir="$WORK/$name")
  [ "$ranks" -eq 1 ] || command=("$LOOM" run -n "$ranks" -- "${command[@]}")
  "${command[@]}" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name"; }
}
same_losses() {  # RUN REFERENCE
  python3 - "$WORK/$1/metrics.jsonl" "$WORK/$2/metrics.jsonl" "$1" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 4, (len(a), len(b))
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
print(f"{sys.argv[3]}: losses {['%.6f' % x for x in a]}, largest relative difference {worst:.1e}")
assert worst < 1e-5, worst
PY
}

train vae 1 "${vae[@]}"
grep -q "eval: held-out loss .* reconstruction PSNR .* dB on 4 clips; 1 held-out clips reconstructed into $WORK/vae/samples/step-00000004" "$WORK/vae.log" ||
  { cat "$WORK/vae.log"; fail "VAE evaluation"; }
[ -s "$WORK/vae/samples/step-00000004/sample-000.gif" ] || fail "no reconstructed clip"
python3 - "$WORK/vae/step-00000004/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
assert len(config["latents_mean"]) == len(config["latents_std"]) == 4, config
assert all(s > 0 for s in config["latents_std"]), config
PY
for layout in dp zero1 zero3; do
  case $layout in dp) extra=();; zero1) extra=(--set parallel.zero=1);; zero3) extra=(--set parallel.zero=3);; esac
  train "vae-$layout" 2 "${vae[@]}" "${extra[@]}"
  same_losses "vae-$layout" vae
done

train dit 1 "${dit[@]}" --set tools.dump_gradients=4
grep -q "eval: held-out flow-matching loss .* on 4 clips; 1 held-out captions sampled into $WORK/dit/samples/step-00000004" "$WORK/dit.log" ||
  { cat "$WORK/dit.log"; fail "DiT evaluation"; }
samples="$WORK/dit/samples/step-00000004"
for file in sample-000.gif sample-000.mp4 sample-000/frame-0000.png sample-000/frame-0004.png captions.json; do
  [ -s "$samples/$file" ] || fail "no $file among the samples"
done
head -c 6 "$samples/sample-000.gif" | grep -q "GIF89a" || fail "sample-000.gif is no GIF"
for layout in dp zero1 zero3 tp2; do
  case $layout in
    dp) extra=(--set training.eval_videos=0);; zero1) extra=(--set parallel.zero=1 --set training.eval_videos=0);;
    zero3) extra=(--set parallel.zero=3 --set training.eval_videos=0);; tp2) extra=(--set parallel.tp=2);;
  esac
  train "dit-$layout" 2 "${dit[@]}" "${extra[@]}"
  same_losses "dit-$layout" dit
done
# Full recompute of the DiT's blocks: the same losses (the gradients of the embeddings that feed every
# block, the text's and the timestep's, are summed in another order, so the weights agree to rounding).
train dit-recompute 1 "${dit[@]}" --set features.recompute=full --set training.eval_videos=0
same_losses dit-recompute dit
# With offload: each block's hidden input goes to the spill file; the text context and time
# modulation every block reads stay.
train dit-offload 1 "${dit[@]}" --set features.recompute=full --set features.offload=true \
  --set training.eval_videos=0
same_losses dit-offload dit
# Selective: the norms', modulations' and GELU's outputs emptied after each block and made again.
train dit-selective 1 "${dit[@]}" --set features.recompute=selective --set training.eval_videos=0
same_losses dit-selective dit
# Pipeline parallelism: the 4 blocks over 2 stages, the time, text and patch embeddings with the first
# and the head with the last; the carry between them holds the hidden states, the text context and the
# time embedding and modulation.
train dit-pp2 2 "${dit[@]}" --set parallel.pp=2 --set training.eval_videos=0
grep -q "model.pipeline_layers: {dit: \[2, 2\]}; this rank (pipeline rank 0) runs time_embedding to blocks.1" \
  "$WORK/dit-pp2.log" || { cat "$WORK/dit-pp2.log"; fail "no pipeline line for the DiT"; }
same_losses dit-pp2 dit
# Context parallelism: each sample's tokens split over 2 ranks (each holding the same positions of
# every sample), as a ring and as Ulysses; the step-4 gradients as one process's too.
train dit-cp2 2 "${dit[@]}" --set parallel.cp=2 --set training.eval_videos=0 --set tools.dump_gradients=4
same_losses dit-cp2 dit
train dit-cp2-ulysses 2 "${dit[@]}" --set parallel.cp=2 --set parallel.cp_ulysses=2 --set training.eval_videos=0 \
  --set tools.dump_gradients=4
same_losses dit-cp2-ulysses dit
# Under pp 2 each stage splits its blocks' tokens over a cp group of its own.
train dit-cp2-pp2 4 "${dit[@]}" --set parallel.cp=2 --set parallel.pp=2 --set training.eval_videos=0
same_losses dit-cp2-pp2 dit
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import runs
grads = runs.tensors(f"{work}/dit/gradients/step-00000004.safetensors")
for name in ("dit-cp2", "dit-cp2-ulysses"):
    theirs = runs.tensors(f"{work}/{name}/gradients/step-00000004.safetensors")
    assert sorted(theirs) == sorted(grads), name
    diff = max(max(abs(a - b) for a, b in zip(grads[k], theirs[k])) for k in grads)
    assert diff <= 1e-5, (name, diff)
    print(f"{name}: step-4 gradients of {len(grads)} tensors within {diff:.1e} of one process")
PY
# Under tp both ranks sample the clip (the DiT's collectives) and the first writes it.
[ -s "$WORK/dit-tp2/samples/step-00000004/sample-000.gif" ] || fail "no clip sampled under tp 2"
if "$LOOM" train "${vae[@]}" --set parallel.tp=2 --set training.output_dir="$WORK/x" 2> "$WORK/err"; then
  fail "the VAE accepted tp 2"
fi
grep -q "the Wan VAE trains under data parallelism, ZeRO-1 and FSDP only" "$WORK/err" || fail "$(cat "$WORK/err")"
if "$LOOM" train "${dit[@]}" --set parallel.cp=2 --set parallel.dynamic_cp=true --set parallel.dynamic_cp_tokens=64 \
    --set training.output_dir="$WORK/x" 2> "$WORK/err"; then
  fail "the DiT accepted parallel.dynamic_cp"
fi
grep -q "parallel.dynamic_cp: the Wan DiT's samples all hold one number of tokens, so one degree fits every step" \
  "$WORK/err" || fail "$(cat "$WORK/err")"

# loom generate: the evaluation's clip again from its caption and seed (the job's settings), byte for byte.
read -r caption seed < <(python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))[0]; print(s["caption"].replace(" ", "_"), s["seed"])' "$samples/captions.json")
caption=${caption//_/ }
"$LOOM" generate "$SRC/configs/wan-moving-fashion.yaml" --set model.vae="$WORK/vae" --set training.sample_steps=3 \
  --checkpoint "$WORK/dit" --prompt "$caption" --seed "$seed" --out "$WORK/clip" > "$WORK/generate.log" 2>&1 ||
  { cat "$WORK/generate.log"; fail "loom generate"; }
for file in video.gif video.mp4 video/frame-0000.png video/frame-0004.png; do
  [ -s "$WORK/clip/$file" ] || fail "loom generate wrote no $file"
done
cmp "$WORK/clip/video.gif" "$samples/sample-000.gif" || fail "loom generate's clip differs from the evaluation's"
if "$LOOM" generate "$SRC/configs/wan-moving-fashion.yaml" --checkpoint "$WORK/dit" --prompt x --prompts p.jsonl \
  --out "$WORK/x" 2> "$WORK/err"; then fail "--prompts with a job file accepted"; fi
grep -q "generate: --prompts is for answers from a model directory" "$WORK/err" || fail "$(cat "$WORK/err")"
echo "wan: VAE and DiT train alike under one process, dp 2, ZeRO-1 and FSDP (the DiT tp 2 too); samples and loom generate write clips"
