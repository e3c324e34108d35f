# Video SFT under every parallel layout, through `loom run` over Gloo, against one process: the tiny
# Qwen2-VL of the e2e tests on a packed conversation file mixing image samples with videos given as
# frame lists (transformers' video fixture's frames: 6, 5 (odd), 2 and 1 of them) and two video files
# that cannot be used (random bytes, empty: skipped and counted in every run), 10 fp32 steps. dp=2,
# tp=2 with sequence parallelism, cp=2 (each frame's vision rows and the tokens split over the ranks)
# and pp=2 give the single-process loss at every step within 1e-5 relative; so do Qwen2.5-VL's cp=2 and
# tp=2 (window attention, temporal positions in seconds).
source "$(dirname "$0")/lib.bash"
FIX="$SRC/tests/fixtures/conversations"
VID="$SRC/tests/fixtures/hf-qwen2-vl-video"
cp "$FIX/images/red.png" "$FIX/images/sky.jpg" "$WORK/"
head -c 4096 /dev/urandom > "$WORK/corrupt.mp4"
: > "$WORK/empty.mp4"
python3 - "$VID" "$WORK/train.jsonl" <<'PY'
import json, sys
vid, out = sys.argv[1:]
six = [f"{vid}/qwen2_vl/frame_00{i}.png" for i in range(6)]
five = [f"{vid}/qwen2_5_vl/frame_00{i}.png" for i in range(5)]
def video(videos, question, answer):
    return {"messages": [{"role": "user", "content": "<video>" + question}, {"role": "assistant", "content": answer}],
            "videos": videos}
def image(path, answer):
    return {"messages": [{"role": "user", "content": "<image>Colour?"}, {"role": "assistant", "content": answer}],
            "images": [path]}
rows = [video([six], "What moves?", "a shape"), image("red.png", "red"), video([five], "Which way?", "left"),
        video([six[:2]], "Two frames?", "yes"), image("sky.jpg", "blue"), video([five[4:]], "One frame?", "still"),
        video(["corrupt.mp4"], "Broken?", "no"), video(["empty.mp4"], "Empty?", "no"),
        {"messages": [{"role": "user", "content": "<image>then<video>"}, {"role": "assistant", "content": "both"}],
         "images": ["red.png"], "videos": [five[:3]]}]
with open(out, "w") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
PY
cat > "$WORK/job.yaml" <<YAML
$(tiny_chat_model 2)
data:
  dataset: messages
  tokenizer: $FIX/chatml_bpe_tokenizer.json
  datasets: [{path: $WORK/train.jsonl}]
  packing: true
  max_pixels: 3136
  video_max_pixels: 4704
  video_fps: 2
  num_workers: 1
training:
  steps: 10
  global_batch_size: 8
  micro_batch_size: 2
  lr: 1.0e-3
  warmup_steps: 2
  precision: fp32
  threads: 1
  eval_every: 0
  save_every: 0
tools: {log_every: 1, progress_bar: false}
YAML
sed -i 's/vocab_size: 267/vocab_size: 268/' "$WORK/job.yaml"  # tp=2 splits the vocabulary
"$LOOM" train "$WORK/job.yaml" --set training.output_dir="$WORK/one" --set training.save_every=10 \
  > "$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "single-process run"; }
# The checkpoint's video processor is the one it trained with: transformers' AutoVideoProcessor reads
# its video_preprocessor_config.json (a frame's bound data.video_max_pixels, 4704, not the images'
# 3136), and on the 6 frames gives the grid and pixel values `loom forward` gives from the checkpoint.
CK="$WORK/one/step-00000010"
python3 - "$CK" "$VID/qwen2_vl" "$WORK/ck_video.json" "$WORK/hf_video.bin" <<'PY' || fail "HF video processor on the checkpoint"
import json, sys
import numpy as np
import transformers
from PIL import Image
ck, fix, given, out = sys.argv[1:]
processor = transformers.AutoVideoProcessor.from_pretrained(ck)
assert type(processor).__name__ == "Qwen2VLVideoProcessor", type(processor)
assert (processor.size.shortest_edge, processor.size.longest_edge) == (3136, 4704), processor.size
frames = [np.asarray(Image.open(f"{fix}/{f}").convert("RGB")) for f in json.load(open(f"{fix}/input.json"))["frames"]]
video = processor(videos=[np.stack(frames)], return_tensors="pt")
grid = video["video_grid_thw"][0].tolist()
assert grid == [3, 4, 6], grid
video["pixel_values_videos"].float().numpy().astype("<f4").tofile(out)
vocab = json.load(open(f"{ck}/tokenizer.json"))["added_tokens"]
token = {t["content"]: t["id"] for t in vocab}
ids = [token["<|im_start|>"], token["<|vision_start|>"]] + [token["<|video_pad|>"]] * (3 * 4 * 6 // 4) + \
      [token["<|vision_end|>"], token["<|im_end|>"]]
json.dump({"input_ids": [ids], "videos": [[f"{fix}/{f}" for f in json.load(open(f"{fix}/input.json"))["frames"]]],
           "video_fps": 2}, open(given, "w"))
PY
"$LOOM" forward --model "$CK" --input "$WORK/ck_video.json" --out "$WORK/ck_forward" > /dev/null ||
  fail "loom forward on the video checkpoint"
python3 - "$WORK/ck_forward" "$WORK/hf_video.bin" <<'PY' || fail "checkpoint video processing differs from HF's"
import json, sys
import numpy as np
out, hf = sys.argv[1:]
assert json.load(open(f"{out}/positions.json"))["video_grid_thw"] == [3, 4, 6]
a, b = np.fromfile(f"{out}/pixel_values_videos.bin", "<f4"), np.fromfile(hf, "<f4")
assert a.shape == b.shape, (a.shape, b.shape)
diff = float(np.abs(a - b).max())
print(f"video checkpoint: HF's video processor from it and loom forward: pixel values max abs difference {diff:.2e}")
assert diff < 1e-5, diff
PY
run() {  # name, ranks, options
  local name=$1 ranks=$2
  shift 2
  "$LOOM" run -n "$ranks" -- "$LOOM" train "$WORK/job.yaml" --set training.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name run"; }
}
run dp2 2
run tp2_sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
run cp2 2 --set parallel.cp=2
run pp2 2 --set parallel.pp=2
# Qwen2.5-VL: window attention in vision block 0, full attention in block 1, and temporal positions
# in seconds (1.5 fps: 4/3 s a temporal patch, 2 tokens a second, truncated).
python3 - "$WORK/job.yaml" "$WORK/job25.yaml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r"    vision_config: .*\n", '''    vision_config: {depth: 2, hidden_size: 32, out_hidden_size: 64, intermediate_size: 64, num_heads: 2,
      in_channels: 3, patch_size: 14, spatial_merge_size: 2, temporal_patch_size: 2, hidden_act: silu,
      window_size: 28, fullatt_block_indexes: [1], tokens_per_second: 2}
''', text)
text = text.replace("family: qwen2_vl", "family: qwen2_5_vl").replace("model_type: qwen2_vl", "model_type: qwen2_5_vl")
text = text.replace("video_fps: 2", "video_fps: 1.5")
assert "qwen2_5_vl" in text and "window_size" in text
open(sys.argv[2], "w").write(text)
PY
"$LOOM" train "$WORK/job25.yaml" --set training.output_dir="$WORK/one25" > "$WORK/one25.log" 2>&1 ||
  { cat "$WORK/one25.log"; fail "Qwen2.5-VL single-process run"; }
for run in "qwen25_cp2 --set parallel.cp=2" "qwen25_tp2_sp --set parallel.tp=2 --set parallel.sequence_parallel=true"; do
  set -- $run
  name=$1
  shift
  "$LOOM" run -n 2 -- "$LOOM" train "$WORK/job25.yaml" --set training.output_dir="$WORK/$name" "$@" \
    > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name run"; }
done
for name in one dp2 tp2_sp cp2 pp2 one25; do
  grep -q "corrupt video" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "$name: no corrupt video counted"; }
done
python3 - "$WORK" "$SRC/tests/e2e" <<'PY'
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from runs import steps
one = steps(f"{work}/one/metrics.jsonl")
assert sorted(one) == list(range(1, 11)), sorted(one)
for name, base in [("dp2", one), ("tp2_sp", one), ("cp2", one), ("pp2", one),
                   ("qwen25_cp2", steps(f"{work}/one25/metrics.jsonl")),
                   ("qwen25_tp2_sp", steps(f"{work}/one25/metrics.jsonl"))]:
    other = steps(f"{work}/{name}/metrics.jsonl")
    assert sorted(other) == list(range(1, 11)), (name, sorted(other))
    worst = max(abs(base[s]["loss"] - other[s]["loss"]) / abs(base[s]["loss"]) for s in other)
    print(f"video sft {name} vs one process: max relative loss difference {worst:.3e} over 10 steps")
    assert worst <= 1e-5, (name, worst)
PY
echo "video sft: dp=2, tp=2+SP, cp=2 and pp=2 (and Qwen2.5-VL's cp=2 and tp=2+SP) match one process"
