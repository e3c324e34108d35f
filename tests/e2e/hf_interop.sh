# Loom's checkpoints and HuggingFace transformers (the pinned oracle) read each other, for Qwen2-VL and
# Qwen2.5-VL: a tiny random model made by transformers (the built-in shapes job's token ids) is
# trained 3 steps by Loom from its save_pretrained; then transformers' from_pretrained loads Loom's
# checkpoint with no missing, unexpected or mismatched keys, AutoProcessor loads its processor and
# chat template, and on one image-and-text input (each side's own processor making the pixel values
# from the image file) HF's logits equal `loom forward`'s within 1e-4. HF's sharded save_pretrained of
# that model loads back in Loom with the same logits.
source "$(dirname "$0")/lib.bash"
cp "$SRC/tests/fixtures/hf-qwen2-vl-tiny/image.png" "$WORK/image.png"  # 56x84 RGB

for family in qwen2_vl qwen2_5_vl; do
  W="$WORK/$family"
  mkdir -p "$W"
  # The tiny HF model, and a job that trains it on the shapes set from its directory alone.
  python3 - "$family" "$SRC/configs/shapes-qwen2vl-tiny.yaml" "$W" <<'PY' || fail "$family: making the HF model"
import sys
import torch
import transformers
import yaml
family, job_path, work = sys.argv[1:]
torch.manual_seed(0)
ids = dict(vision_start_token_id=3, vision_end_token_id=4, image_token_id=5, video_token_id=6)
text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
            tie_word_embeddings=False, vocab_size=64, bos_token_id=0, eos_token_id=2,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
if family == "qwen2_vl":
    vision = dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, hidden_act="quick_gelu")
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    model = transformers.Qwen2VLForConditionalGeneration(config)
else:
    # Window attention in the first block, full attention in the second; windows of 2x2 merged patches.
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                  hidden_act="silu")
    config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config)
with torch.no_grad():  # every weight random, so a missing norm or bias shows
    for p in model.parameters():
        p.normal_(0.0, 0.2)
model.save_pretrained(f"{work}/hf-init")
job = yaml.safe_load(open(job_path))
job["model"] = {"family": family, "init_from": f"{work}/hf-init"}
job["data"]["eval_samples"] = 50
job["training"].update(steps=3, global_batch_size=8, micro_batch_size=8, warmup_steps=1, save_every=3,
                       eval_every=0, threads=2, output_dir=f"{work}/run")
job.setdefault("tools", {})["progress_bar"] = False
yaml.safe_dump(job, open(f"{work}/job.yaml", "w"))
PY
  "$LOOM" train "$W/job.yaml" > "$W/train.log" 2>&1 || { cat "$W/train.log"; fail "$family: loom train"; }
  CK="$W/run/step-00000003"
  [ -f "$CK/model.safetensors" ] || fail "$family: no checkpoint at step 3"

  # transformers loads Loom's checkpoint and processor; the input both sides run; HF's logits.
  python3 - "$CK" "$W" <<'PY' || fail "$family: transformers could not load Loom's checkpoint"
import json, sys
import numpy as np
import torch
import transformers
from PIL import Image
ck, work = sys.argv[1:]
model, info = transformers.AutoModelForImageTextToText.from_pretrained(ck, output_loading_info=True)
for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
    assert not info[kind], f"{kind}: {sorted(info[kind])[:10]}"
model.eval()
processor = transformers.AutoProcessor.from_pretrained(ck)
assert processor.chat_template, "no chat template"
# Loom's image processor is Qwen2-VL's PIL one (transformers' torchvision backend resizes otherwise,
# up to 0.015 apart in pixel values): the comparison's pixels come from that backend.
pil_images = transformers.AutoImageProcessor.from_pretrained(ck, backend="pil")
messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what color is the shape ?"}]}]
prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
image = Image.open(f"{work}/../image.png").convert("RGB")
inputs = processor(text=[prompt], images=[image], return_tensors="pt")
pil = pil_images(images=[image], return_tensors="pt")
assert torch.equal(pil["image_grid_thw"], inputs["image_grid_thw"])
inputs["pixel_values"] = pil["pixel_values"]
ids = inputs["input_ids"][0].tolist()
assert ids.count(model.config.image_token_id) == int(inputs["image_grid_thw"].prod()) // 4, ids
with torch.no_grad():
    logits = model(**inputs).logits[0]
json.dump({"input_ids": [ids], "images": [f"{work}/../image.png"]}, open(f"{work}/input.json", "w"))
np.asarray(logits, dtype="<f4").tofile(f"{work}/hf_logits.bin")
print(f"transformers loaded {sum(p.numel() for p in model.parameters())} parameters with no missing, unexpected "
      f"or mismatched keys; {len(ids)} input tokens, {int(inputs['image_grid_thw'].prod())} patches")
# HF's own sharded save of the model it loaded, with its processor.
model.save_pretrained(f"{work}/hf-saved", max_shard_size="100KB")
processor.save_pretrained(f"{work}/hf-saved")
shards = json.load(open(f"{work}/hf-saved/model.safetensors.index.json"))["weight_map"]
assert len(set(shards.values())) > 1, "expected several shards"
PY

  "$LOOM" forward --model "$CK" --input "$W/input.json" --out "$W/loom" > "$W/forward.log" 2>&1 ||
    { cat "$W/forward.log"; fail "$family: loom forward of its checkpoint"; }
  "$LOOM" forward --model "$W/hf-saved" --input "$W/input.json" --out "$W/loom-from-hf" > "$W/forward-hf.log" 2>&1 ||
    { cat "$W/forward-hf.log"; fail "$family: loom forward of HF's sharded save"; }
  python3 - "$W" "$family" <<'PY' || fail "$family: logits differ"
import sys
import numpy as np
work, family = sys.argv[1:]
hf = np.fromfile(f"{work}/hf_logits.bin", dtype="<f4")
for run, what in (("loom", "Loom's checkpoint"), ("loom-from-hf", "HF's sharded save")):
    loom = np.fromfile(f"{work}/{run}/logits.bin", dtype="<f4")
    assert loom.shape == hf.shape and hf.size > 0, (loom.shape, hf.shape)
    diff = float(np.abs(loom - hf).max())
    print(f"{family}: loom forward of {what} vs transformers: {hf.size} logits, max abs difference {diff:.1e}")
    assert diff <= 1e-4, diff
PY
done
echo "HF interop: transformers loads Loom's Qwen2-VL and Qwen2.5-VL checkpoints and processors, Loom loads HF's sharded saves, the logits agree"
