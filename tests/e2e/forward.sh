# `loom forward` on the HuggingFace tiny Qwen2-VL fixture reproduces HuggingFace's logits and
# image embeddings (max abs difference 1e-4).
source "$(dirname "$0")/lib.bash"
FIX="$SRC/tests/fixtures/hf-qwen2-vl-tiny"
python3 - "$FIX/input.json" "$WORK/input.json" <<'PY'
import json, os, sys
src = json.load(open(sys.argv[1]))
fixture_dir = os.path.dirname(os.path.abspath(sys.argv[1]))
json.dump({"input_ids": src["input_ids"], "images": [os.path.join(fixture_dir, "image.png")]}, open(sys.argv[2], "w"))
PY
"$LOOM" forward --model "$FIX" --input "$WORK/input.json" --out "$WORK/out" || fail "forward failed"
python3 - "$WORK/out" "$FIX" <<'PY'
import json, struct, sys
out, fix = sys.argv[1], sys.argv[2]
def floats(path):
    data = open(path, "rb").read()
    return struct.unpack(f"<{len(data) // 4}f", data)
shapes = json.load(open(f"{out}/shapes.json"))
assert shapes["logits"] == [1, 21, 256], shapes
assert shapes["image_embeds"] == [6, 64], shapes
for name in ("logits.bin", "image_embeds.bin"):
    a, b = floats(f"{out}/{name}"), floats(f"{fix}/{name}")
    assert len(a) == len(b), name
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"{name}: max abs difference {diff:.2e}")
    assert diff < 1e-4, (name, diff)
PY
# The umT5 encoder (HF's UMT5EncoderModel format: input_ids and attention_mask) gives HF's
# last_hidden_state within 1e-5 on the real tokens (padded positions are not compared: nothing uses them).
UMT5="$SRC/tests/fixtures/umt5-tiny"
"$LOOM" forward --model "$UMT5" --input "$UMT5/input.json" --out "$WORK/umt5" || fail "umT5 forward failed"
python3 - "$WORK/umt5" "$UMT5" <<'PY'
import json, struct, sys
out, fix = sys.argv[1], sys.argv[2]
def floats(path):
    data = open(path, "rb").read()
    return struct.unpack(f"<{len(data) // 4}f", data)
assert json.load(open(f"{out}/shapes.json"))["last_hidden_state.bin"] == [2, 12, 32]
mask = json.load(open(f"{fix}/input.json"))["attention_mask"]
a, b = floats(f"{out}/last_hidden_state.bin"), floats(f"{fix}/last_hidden_state.bin")
diff = max(abs(a[i] - b[i]) for i in range(len(a)) if mask[i // (12 * 32)][(i // 32) % 12])
print(f"umT5 last_hidden_state.bin: max abs difference {diff:.2e} on the real tokens")
assert diff < 1e-5, diff
PY
# Wan2.1's DiT and VAE on the inputs of the official code's reference run (io.json): out.bin, and per
# clip length mu, log_var and the decoded video, within 1e-5 of upstream's.
for part in dit vae; do
  "$LOOM" forward --model "$SRC/tests/fixtures/wan-tiny/$part" --input "$SRC/tests/fixtures/wan-tiny/$part/io.json" \
    --out "$WORK/wan-$part" || fail "Wan $part forward failed"
done
python3 - "$WORK" "$SRC/tests/fixtures/wan-tiny" <<'PY'
import json, struct, sys
work, fix = sys.argv[1], sys.argv[2]
def floats(path):
    data = open(path, "rb").read()
    return struct.unpack(f"<{len(data) // 4}f", data)
names = [("dit", "out.bin")] + [("vae", f"{case}_{what}.bin") for case in ("t5", "t9") for what in ("mu", "log_var", "decoded_raw")]
for part, name in names:
    a, b = floats(f"{work}/wan-{part}/{name}"), floats(f"{fix}/{part}/{name}")
    assert len(a) == len(b), (part, name, len(a), len(b))
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"Wan {part} {name}: max abs difference {diff:.2e}")
    assert diff < 1e-5, (part, name, diff)
PY
# InternVL (a Qwen2 and a Qwen3 language model), every sample of the tiny fixture: the PNGs through
# Loom's InternVL processor (tiles and thumbnails), then logits and image embeddings within 1e-4 of
# transformers' (under two ranks too: the model split by tensor parallelism).
IVL="$SRC/tests/fixtures/internvl-tiny"
forward_on() {  # ranks, what, forward's options: one process, or two (tensor parallelism)
  local ranks=$1 what=$2
  shift 2
  if [ "$ranks" = 1 ]; then
    "$LOOM" forward "$@" > /dev/null || fail "$what forward failed"
  else
    "$LOOM" run -n "$ranks" -- "$LOOM" forward "$@" > /dev/null || fail "$what forward over $ranks ranks failed"
  fi
}
for variant in qwen2 qwen3; do
  for sample in s1_1tile s2_2tiles s3_6tiles s4_two_images; do
    python3 - "$IVL" "$sample" "$WORK/ivl-$sample.json" <<'PY'
import json, sys
fix, name, out = sys.argv[1:]
inputs = json.load(open(f"{fix}/inputs/inputs.json"))
sample = next(s for s in inputs["samples"] if s["name"] == name)
images = [f"{fix}/inputs/{inputs['images'][i]['file']}" for i in sample["images"]]
json.dump({"input_ids": sample["input_ids"], "images": images}, open(out, "w"))
PY
    for ranks in 1 2; do
      out="$WORK/ivl-$variant-$sample-$ranks"
      forward_on "$ranks" "InternVL $variant $sample" --model "$IVL/$variant" --input "$WORK/ivl-$sample.json" \
        --out "$out"
      python3 - "$out" "$IVL/$variant/expected" "$sample" "$variant $ranks" <<'PY'
import json, struct, sys
out, expected, name, what = sys.argv[1:]
def floats(path):
    data = open(path, "rb").read()
    return struct.unpack(f"<{len(data) // 4}f", data)
shapes = json.load(open(f"{out}/shapes.json"))
want = json.load(open(f"{expected}/expected.json"))["samples"][name]
for key in ("logits", "image_embeds"):
    assert shapes[key] == want[key]["shape"], (key, shapes[key], want[key]["shape"])
    a, b = floats(f"{out}/{key}.bin"), floats(f"{expected}/{want[key]['file']}")
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"InternVL {what} rank(s) {name} {key}: max abs difference {diff:.2e}")
    assert diff < 1e-4, (key, diff)
PY
    done
  done
done
# Qwen2-VL and Qwen2.5-VL videos given as frame files (transformers' run on them:
# tests/fixtures/hf-qwen2-vl-video), on one and two ranks (tensor parallelism): pixel values within
# 1e-5, the grid and every position id exact, video embeddings and logits within 1e-4. Then clips of
# 2 frames (Qwen2-VL's first temporal patch) and 1 frame (Qwen2.5-VL's last, an odd clip's repeated
# frame) in the same text with 6 video pads: their patch of the fixture's rows and embeddings, and the
# positions M-RoPE gives a 1-patch block.
VID="$SRC/tests/fixtures/hf-qwen2-vl-video"
for family in qwen2_vl qwen2_5_vl; do
  for clip in whole short; do
    python3 - "$VID/$family" "$clip" "$WORK/video-$family-$clip.json" <<'PY'
import json, sys
fix, clip, out = sys.argv[1:]
src = json.load(open(f"{fix}/input.json"))
frames, ids = src["frames"], src["input_ids"][0]
if clip == "short":
    frames = frames[-1:] if len(frames) % 2 else frames[:2]  # 1 frame (odd clip) or 2
    pad = src["token_ids"]["video_pad"]
    first = ids.index(pad)
    ids = ids[:first] + [pad] * 6 + ids[first + src["num_video_tokens"]:]
json.dump({"input_ids": [ids], "videos": [[f"{fix}/{f}" for f in frames]], "video_fps": src["fps"]}, open(out, "w"))
PY
    for ranks in 1 2; do
      out="$WORK/video-$family-$clip-$ranks"
      forward_on "$ranks" "$family video" --model "$VID/$family" --input "$WORK/video-$family-$clip.json" \
        --out "$out"
      python3 - "$out" "$VID/$family" "$clip" "$family $ranks rank(s) $clip" "$WORK/video-$family-$clip.json" <<'PY'
import json, struct, sys
out, fix, clip, what, given = sys.argv[1:]
def floats(path):
    data = open(path, "rb").read()
    return struct.unpack(f"<{len(data) // 4}f", data)
src = json.load(open(f"{fix}/input.json"))
got = json.load(open(f"{out}/positions.json"))
shapes = json.load(open(f"{out}/shapes.json"))
odd = len(src["frames"]) % 2
def check(name, rows_per_patch, bound, patch=None):
    a, b = floats(f"{out}/{name}.bin"), floats(f"{fix}/{name}.bin")
    if patch is not None:  # the fixture's rows of one temporal patch
        width = len(b) // (3 * rows_per_patch)
        b = b[patch * rows_per_patch * width:(patch + 1) * rows_per_patch * width]
    assert len(a) == len(b), (name, len(a), len(b))
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"{what} {name}: max abs difference {diff:.2e}")
    assert diff < bound, (name, diff)
if clip == "whole":
    assert got["video_grid_thw"] == [3, 4, 6], got["video_grid_thw"]
    flat = [p for axis in src["position_ids"] for row in axis for p in row]
    assert got["position_ids"] == flat, "position ids differ"
    if "second_per_grid_ts" in src:
        assert abs(got["second_per_grid_ts"][0] - src["second_per_grid_ts"][0]) < 1e-15, got["second_per_grid_ts"]
    check("pixel_values_videos", 24, 1e-5)
    check("video_embeds", 6, 1e-4)
    a, b = floats(f"{out}/logits.bin"), floats(f"{fix}/logits.bin")
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"{what} logits: max abs difference {diff:.2e}")
    assert diff < 1e-4, diff
else:
    assert got["video_grid_thw"] == [1, 4, 6], got["video_grid_thw"]
    patch = 2 if odd else 0
    check("pixel_values_videos", 24, 1e-5, patch)
    check("video_embeds", 6, 1e-4, patch)
    # Text counts up; the block of 6 tokens (2 x 3 merged) starts at s: (s, s + row, s + col).
    ids = json.load(open(given))["input_ids"][0]
    pad = src["token_ids"]["video_pad"]
    first, n = ids.index(pad), len(ids)
    want = [[], [], []]
    for i in range(n):
        for axis in range(3):
            if i < first:
                want[axis].append(i)
            elif i < first + 6:
                k = i - first
                want[axis].append(first + (0, k // 3, k % 3)[axis])
            else:
                want[axis].append(i - 6 + 3)  # max in the block is first + 2, then + 1
    assert got["position_ids"] == want[0] + want[1] + want[2], "short clip position ids differ"
    assert shapes["logits"] == [1, n, 256], shapes
PY
    done
  done
done
# Qwen3.5, dense and MoE (tests/fixtures/qwen3_5/{dense,moe}: tiny random models as transformers
# saves them, with an MTP tensor Loom leaves unread): the image through Loom's processor with the
# directory's settings, then logits within 1e-4 of transformers'.
for variant in dense moe; do
  Q35="$SRC/tests/fixtures/qwen3_5/$variant"
  python3 - "$Q35" "$WORK/q35-$variant.json" <<'PY'
import json, sys
from safetensors.numpy import load_file
fix, out = sys.argv[1:]
expected = load_file(f"{fix}/expected.safetensors")
json.dump({"input_ids": expected["image.input_ids"].tolist(), "images": [f"{fix}/image.png"]}, open(out, "w"))
PY
  "$LOOM" forward --model "$Q35" --input "$WORK/q35-$variant.json" --out "$WORK/q35-$variant" > "$WORK/q35-$variant.log" 2>&1 ||
    { cat "$WORK/q35-$variant.log"; fail "Qwen3.5 $variant forward failed"; }
  grep -q "left 1 multi-token-prediction tensors (mtp.\*) unread" "$WORK/q35-$variant.log" ||
    { cat "$WORK/q35-$variant.log"; fail "Qwen3.5 $variant: the MTP tensor was not reported"; }
  python3 - "$WORK/q35-$variant" "$Q35" "$variant" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file
out, fix, variant = sys.argv[1:]
expected = load_file(f"{fix}/expected.safetensors")["image.logits"]
got = np.fromfile(f"{out}/logits.bin", "<f4").reshape(expected.shape)
diff = float(np.abs(got - expected).max())
print(f"Qwen3.5 {variant} image prompt logits: max abs difference {diff:.2e}")
assert diff < 1e-4, diff
PY
done
