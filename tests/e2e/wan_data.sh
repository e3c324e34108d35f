# The video jobs' data paths end to end, shrunk: (1) loom data extract-features, and a DiT trained on the
# features with exactly the losses, evaluation and sampled clip of the same DiT encoding its clips on the
# fly; (2) the user's videos (dataset: videos): a VAE trains on a caption file whose bad rows and
# corrupt, truncated, empty and missing files are skipped, counted and named; an unusable held-out
# video, a features directory of an unfinished extraction and a VAE checkpoint whose weights disagree
# with its config.json are one-line errors naming them.
source "$(dirname "$0")/lib.bash"
shrink=(--set tools.progress_bar=false --set tools.log_every=1 --set data.num_workers=0
  --set training.global_batch_size=4 --set training.micro_batch_size=2 --set training.warmup_steps=0
  --set training.save_every=0 --set training.steps=4)
run() {  # NAME CONFIG ARGS...: loom train, output_dir $WORK/NAME, log $WORK/NAME.log
  local name=$1
  shift
  "$LOOM" train "$@" --set training.output_dir="$WORK/$name" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name"; }
}
expect_error() {  # WHAT PATTERN COMMAND...: the command fails, its last line says PATTERN
  local what=$1 pattern=$2
  shift 2
  if "$@" > "$WORK/err.log" 2>&1; then cat "$WORK/err.log"; fail "$what was accepted"; fi
  tail -1 "$WORK/err.log" | grep -q -- "$pattern" || { cat "$WORK/err.log"; fail "$what: no '$pattern'"; }
  echo "ok: $(tail -1 "$WORK/err.log")"
}

run vae "$SRC/configs/wan-moving-fashion-vae.yaml" "${shrink[@]}" --set data.eval_samples=4 --set training.eval_videos=0
dit=(--set model.vae="$WORK/vae" --set training.eval_videos=1 --set training.sample_steps=3 --set data.eval_samples=4
  --set data.features=)
run dit "$SRC/configs/wan-moving-fashion.yaml" "${shrink[@]}" "${dit[@]}"

# (1) Features of the first 16 training clips (the 4 steps) and the 4 held-out ones.
"$LOOM" data extract-features "$SRC/configs/wan-moving-fashion.yaml" "${dit[@]}" --set data.features="$WORK/features" \
  --samples 16 > "$WORK/extract.log" 2>&1 || { cat "$WORK/extract.log"; fail "extract-features"; }
grep -q "extract-features: 16 training samples (0 skipped as unusable) and 4 held-out ones in $WORK/features" \
  "$WORK/extract.log" || { cat "$WORK/extract.log"; fail "extract-features summary"; }
features=("$SRC/configs/wan-moving-fashion.yaml" "${shrink[@]}" "${dit[@]}" --set data.features="$WORK/features")
run dit-features "${features[@]}"
python3 - "$WORK/dit/metrics.jsonl" "$WORK/dit-features/metrics.jsonl" <<'PY'
import json, sys
def records(path):
    return [r for r in map(json.loads, open(path)) if "loss" in r or "eval_loss" in r]
a, b = records(sys.argv[1]), records(sys.argv[2])
pairs = [(x.get("loss", x.get("eval_loss")), y.get("loss", y.get("eval_loss"))) for x, y in zip(a, b)]
print("on the fly vs features:", [f"{x:.9f}/{y:.9f}" for x, y in pairs])
assert len(a) == len(b) == 5 and all(x == y for x, y in pairs), pairs
PY
cmp "$WORK/dit/samples/step-00000004/sample-000.gif" "$WORK/dit-features/samples/step-00000004/sample-000.gif" ||
  fail "the features run sampled another clip"
expect_error "a second extraction into a full directory" "exists and is not an empty directory" \
  "$LOOM" data extract-features "${features[@]}" --samples 4
mkdir "$WORK/unfinished" && cp "$WORK/features/"*.safetensors "$WORK/unfinished/"
expect_error "an unfinished extraction" "has no features.json" \
  "$LOOM" train "${features[@]}" --set data.features="$WORK/unfinished" --set training.output_dir="$WORK/x"
expect_error "features of another text encoder" "made by another text encoder" \
  "$LOOM" train "${features[@]}" --set training.seed=7 --set training.output_dir="$WORK/x"
expect_error "features of other clips" "data.frames: 9 here, but the features in $WORK/features were extracted from 5" \
  "$LOOM" train "${features[@]}" --set data.frames=9 --set training.output_dir="$WORK/x"

# (2) The user's videos: the sampled clips as videos, a frame as an image, and bad files and rows.
media="$WORK/media"
mkdir "$media"
cp "$WORK/dit/samples/step-00000004/sample-000.gif" "$media/a.gif"
cp "$WORK/dit/samples/step-00000004/sample-000.mp4" "$media/b.mp4"
cp "$WORK/dit/samples/step-00000004/sample-000/frame-0004.png" "$media/c.png"
head -c 3000 /dev/urandom > "$media/noise.mp4"
head -c 600 "$media/b.mp4" > "$media/cut.mp4"
: > "$media/empty.mp4"
cat > "$media/train.jsonl" <<'EOF'
{"video": "a.gif", "caption": "a clip"}
{"video": "b.mp4", "caption": "a clip again"}
{"image": "c.png", "caption": "a frame"}
{"video": "noise.mp4", "caption": "noise"}
{"video": "cut.mp4", "caption": "cut"}
{"video": "empty.mp4", "caption": "empty"}
{"video": "gone.mp4", "caption": "missing"}
{"video": ["a.gif"], "caption": "a list"}
{"video": "a.gif", "caption": 12}
EOF
printf '{"video": "a.gif", "caption": "held out"}\n' > "$media/eval.jsonl"
videos=(--set data.dataset=videos --set "data.datasets=[{path: $media/train.jsonl}]"
  --set "data.eval_datasets=[{path: $media/eval.jsonl}]" --set data.frames=5 --set data.fps=8
  --set data.eval_samples=4)
run vae-videos "$SRC/configs/wan-moving-fashion-vae.yaml" "${shrink[@]}" "${videos[@]}" --set training.eval_videos=1
log="$WORK/vae-videos.log"
grep -q "data: 7 training clips and images in 1 files, 1 held out; 2 samples skipped while reading" "$log" ||
  { cat "$log"; fail "the caption file's bad rows were not counted"; }
for pattern in "skipped sample 7 of $media/train.jsonl (bad sample): \"video\" must be a non-empty path, got array" \
  "skipped sample 8 of $media/train.jsonl (bad sample): \"caption\" must be a string, got number" \
  "(corrupt video): cannot decode video $media/noise.mp4" "(corrupt video): cannot decode video $media/cut.mp4" \
  "(corrupt video): cannot decode video $media/empty.mp4" "(missing video): cannot decode video $media/gone.mp4" \
  "eval: held-out loss .* on 1 clips"; do
  grep -q -- "$pattern" "$log" || { cat "$log"; fail "no '$pattern'"; }
done
# 16 samples over 4 steps from an epoch of 7, 4 of them unusable: the skips are counted.
python3 - "$log" <<'PY'
import re, sys
skipped = int(re.search(r"unusable samples skipped: (\d+)", open(sys.argv[1]).read()).group(1))
print("videos: unusable samples skipped", skipped)
assert 4 <= skipped < 16, skipped
PY
printf '{"video": "noise.mp4", "caption": "held out"}\n' > "$media/bad-eval.jsonl"
expect_error "an unusable held-out video" "held-out sample 0 of $media/bad-eval.jsonl cannot be used" \
  "$LOOM" train "$SRC/configs/wan-moving-fashion-vae.yaml" "${shrink[@]}" "${videos[@]}" \
  --set "data.eval_datasets=[{path: $media/bad-eval.jsonl}]" --set training.output_dir="$WORK/x"
expect_error "data.features for the VAE" "data.features: is read by task flow_matching only" \
  "$LOOM" train "$SRC/configs/wan-moving-fashion-vae.yaml" --set data.features="$WORK/features" --set training.output_dir="$WORK/x"
expect_error "data.fps on the built-in set" "data.fps=4: is only used by dataset videos" \
  "$LOOM" train "$SRC/configs/wan-moving-fashion-vae.yaml" --set data.fps=4 --set training.output_dir="$WORK/x"

# A VAE checkpoint whose config.json disagrees with its weights.
cp -r "$WORK/vae/step-00000004" "$WORK/vae-wide"
python3 - "$WORK/vae-wide/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
key = "base_dim" if "base_dim" in config else "dim"
config[key] *= 2
json.dump(config, open(sys.argv[1], "w"))
PY
expect_error "a VAE whose weights disagree with its config" "$WORK/vae-wide" \
  "$LOOM" train "$SRC/configs/wan-moving-fashion.yaml" "${shrink[@]}" "${dit[@]}" --set model.vae="$WORK/vae-wide" \
  --set training.output_dir="$WORK/x"
echo "wan_data: features train as the clips do; the user's videos are decoded, bad ones skipped and named"
