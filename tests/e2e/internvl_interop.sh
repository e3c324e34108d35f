# Loom's InternVL checkpoints and HuggingFace transformers (the pinned oracle) read each other: a tiny
# random InternVL made by transformers (the tiny model of configs/shapes-internvl-tiny.yaml with an
# untied head, every weight random) is trained 3 steps by Loom from its save_pretrained; then
# transformers' from_pretrained loads Loom's checkpoint with no missing, unexpected or mismatched keys,
# AutoProcessor makes an InternVLProcessor from the checkpoint's files (its tokens by name, the chat
# template, image_seq_length), and on an image-and-text prompt that processor tokenizes, HF's logits
# equal `loom forward`'s within 1e-4: as the checkpoint was saved (one tile per image, as trained), and
# with the checkpoint's max_patches raised to 6 (the 84x56 image as 3 x 2 tiles and a thumbnail). HF's
# sharded save_pretrained of the model it loaded, with its processor, loads back in Loom with the same
# logits.
source "$(dirname "$0")/lib.bash"
cp "$SRC/tests/fixtures/hf-qwen2-vl-tiny/image.png" "$WORK/image.png"  # 84 wide, 56 high, RGB

python3 - "$SRC/configs/shapes-internvl-tiny.yaml" "$WORK" <<'PY' || fail "making the HF model"
import sys
import torch
import transformers
import yaml
job_path, work = sys.argv[1:]
job = yaml.safe_load(open(job_path))
hf = job["model"]["hf_config"]
hf["tie_word_embeddings"] = hf["text_config"]["tie_word_embeddings"] = False
torch.manual_seed(0)
model = transformers.InternVLForConditionalGeneration(transformers.InternVLConfig(**hf))
with torch.no_grad():  # every weight random, so a missing norm, bias or layer scale shows
    for p in model.parameters():
        p.normal_(0.0, 0.2)
model.save_pretrained(f"{work}/hf-init")
job["model"] = {"family": "internvl", "init_from": f"{work}/hf-init"}
job["data"]["eval_samples"] = 20
job["training"].update(steps=3, global_batch_size=8, micro_batch_size=8, warmup_steps=1, save_every=3,
                       eval_every=0, threads=2, output_dir=f"{work}/run")
job.setdefault("tools", {})["progress_bar"] = False
yaml.safe_dump(job, open(f"{work}/job.yaml", "w"))
PY
"$LOOM" train "$WORK/job.yaml" > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "loom train"; }
CK="$WORK/run/step-00000003"
[ -f "$CK/model.safetensors" ] || fail "no checkpoint at step 3"
# The same checkpoint with more tiles allowed per image.
cp -r "$CK" "$WORK/tiled"
python3 - "$WORK/tiled/preprocessor_config.json" <<'PY'
import json, sys
settings = json.load(open(sys.argv[1]))
assert settings["max_patches"] == 1, settings  # the shapes set's squares are one tile each
settings["max_patches"] = 6
json.dump(settings, open(sys.argv[1], "w"), indent=2)
PY

# transformers loads each checkpoint and its processor; the input both sides run; HF's logits.
for name in run/step-00000003 tiled; do
  python3 - "$WORK/$name" "$WORK" "$(basename "$name")" <<'PY' || fail "$name: transformers could not load Loom's checkpoint"
import json, sys
import numpy as np
import torch
import transformers
from PIL import Image
ck, work, name = sys.argv[1:]
model, info = transformers.AutoModelForImageTextToText.from_pretrained(ck, output_loading_info=True)
for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
    assert not info[kind], f"{kind}: {sorted(info[kind])[:10]}"
assert type(model).__name__ == "InternVLForConditionalGeneration", type(model)
model.eval()
processor = transformers.AutoProcessor.from_pretrained(ck)
assert type(processor).__name__ == "InternVLProcessor", type(processor)
assert processor.chat_template, "no chat template"
assert processor.image_seq_length == 4, processor.image_seq_length
assert processor.image_token_id == model.config.image_token_id, (processor.image_token_id, model.config.image_token_id)
# Loom's image processor is GotOcr2's PIL one (the torchvision backend resizes otherwise): the
# comparison's pixels come from that backend, tiled as InternVLProcessor tiles them.
pil_images = transformers.AutoImageProcessor.from_pretrained(ck, backend="pil")
messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what color is the shape ?"}]}]
prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
image = Image.open(f"{work}/image.png").convert("RGB")
inputs = processor(text=[prompt], images=[image], return_tensors="pt")
pil = pil_images(images=[image], crop_to_patches=True, return_tensors="pt")
tiles = {"step-00000003": 1, "tiled": 7}[name]
assert pil["pixel_values"].shape == inputs["pixel_values"].shape == (tiles, 3, 28, 28), (pil["pixel_values"].shape, inputs["pixel_values"].shape)
inputs["pixel_values"] = pil["pixel_values"]
ids = inputs["input_ids"][0].tolist()
block = [processor.start_image_token_id] + [processor.image_token_id] * 4 * tiles + [processor.end_image_token_id]
assert any(ids[i:i + len(block)] == block for i in range(len(ids))), ids
with torch.no_grad():
    logits = model(**inputs).logits[0]
json.dump({"input_ids": [ids], "images": [f"{work}/image.png"]}, open(f"{work}/{name}-input.json", "w"))
np.asarray(logits, dtype="<f4").tofile(f"{work}/{name}-hf_logits.bin")
print(f"{name}: transformers loaded {sum(p.numel() for p in model.parameters())} parameters with no missing, "
      f"unexpected or mismatched keys; {len(ids)} input tokens, {tiles} tiles")
if name == "step-00000003":  # HF's own sharded save of the model it loaded, with its processor
    model.save_pretrained(f"{work}/hf-saved", max_shard_size="100KB")
    processor.save_pretrained(f"{work}/hf-saved")
    shards = json.load(open(f"{work}/hf-saved/model.safetensors.index.json"))["weight_map"]
    assert len(set(shards.values())) > 1, "expected several shards"
PY
done

forward() {  # model dir, input json, output dir
  "$LOOM" forward --model "$1" --input "$2" --out "$3" > "$3.log" 2>&1 || { cat "$3.log"; fail "loom forward of $1"; }
}
forward "$CK" "$WORK/step-00000003-input.json" "$WORK/loom"
forward "$WORK/tiled" "$WORK/tiled-input.json" "$WORK/loom-tiled"
forward "$WORK/hf-saved" "$WORK/step-00000003-input.json" "$WORK/loom-from-hf"
python3 - "$WORK" <<'PY' || fail "logits differ"
import sys
import numpy as np
work = sys.argv[1]
for run, reference, what in (("loom", "step-00000003", "Loom's checkpoint"),
                             ("loom-tiled", "tiled", "Loom's checkpoint at up to 6 tiles"),
                             ("loom-from-hf", "step-00000003", "HF's sharded save")):
    hf = np.fromfile(f"{work}/{reference}-hf_logits.bin", dtype="<f4")
    loom = np.fromfile(f"{work}/{run}/logits.bin", dtype="<f4")
    assert loom.shape == hf.shape and hf.size > 0, (loom.shape, hf.shape)
    diff = float(np.abs(loom - hf).max())
    print(f"internvl: loom forward of {what} vs transformers: {hf.size} logits, max abs difference {diff:.1e}")
    assert diff <= 1e-4, diff
PY
echo "InternVL interop: transformers loads Loom's checkpoint and processor, Loom loads HF's sharded save, the logits agree"
