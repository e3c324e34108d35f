#!/usr/bin/env python3
"""Qwen2-VL as a user trains it today: transformers' own Qwen2VLForConditionalGeneration (or
Qwen2_5_VLForConditionalGeneration for a qwen2_5_vl export) with SDPA attention, float32 on the CPU;
the peer that `bench/compare` runs beside Loom.

It reads what `loom data export` writes: the job's config.json and initial weights (HF's names, which
from_pretrained loads as a checkpoint), the training settings, and each step's micro-batches with
their M-RoPE position ids, and trains the model on them with torch.optim.AdamW (eager_training.py).

A packed row (several samples back to back, with cu_seqlens) goes in as transformers takes packed
input: no attention mask, and position ids of shape (4, 1, L) whose first row restarts at 0 at each
sample's start; from it transformers builds the block-diagonal causal mask (masking_utils' packed
sequence detection), and the other three rows are the M-RoPE positions. The vision tower attends
within each image by itself (its cu_seqlens come from image_grid_thw). A padded batch goes in with
its attention mask and the exported (3, B, L) position ids.

  qwen2vl_transformers.py EXPORT_DIR [--steps N]                    print each step's loss (JSON lines)
  qwen2vl_transformers.py EXPORT_DIR --bench --steps N --warmup W   time N steps after W, print one JSON

Run it with the project virtualenv's Python (`.venv`, made by `bash scripts/setup.sh --oracles`:
torch and the pinned transformers), as bench/compare does.
"""
import json
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration

from eager_training import train

IGNORE_INDEX = -100
MODELS = {"qwen2_vl": Qwen2VLForConditionalGeneration, "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration}


def load_model(model_dir):
    hf = json.load(open(f"{model_dir}/config.json"))
    if hf.get("model_type") not in MODELS:
        sys.exit(f"qwen2vl_transformers.py: model_type {hf.get('model_type')!r}; the reference trains "
                 f"{', '.join(MODELS)}")
    model_class = MODELS[hf["model_type"]]
    # Loom writes Qwen2.5-VL's vision_config.tokens_per_second as a number (2.0); transformers 5's
    # config declares an int and refuses a float.
    vision = hf.get("vision_config", {})
    if isinstance(vision.get("tokens_per_second"), float) and vision["tokens_per_second"].is_integer():
        vision["tokens_per_second"] = int(vision["tokens_per_second"])
    model, info = model_class.from_pretrained(model_dir, config=model_class.config_class.from_dict(hf),
                                              attn_implementation="sdpa", dtype=torch.float32,
                                              output_loading_info=True)
    if any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        sys.exit(f"qwen2vl_transformers.py: the weights in {model_dir} do not fit {model_class.__name__}: {info}")
    return model


def packed_position_ids(b):
    """(4, 1, L): each sample's text positions 0, 1, ... (transformers finds the samples' boundaries
    where they restart), then the exported M-RoPE positions (3, 1, L)."""
    if b["input_ids"].shape[0] != 1:
        sys.exit(f"qwen2vl_transformers.py: a packed micro-batch is one row, not {b['input_ids'].shape[0]}")
    cu = b["cu_seqlens"]
    text = torch.arange(int(cu[-1])) - torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1])
    return torch.cat([text.view(1, 1, -1), b["position_ids"]])


def model_inputs(b):
    inputs = {"input_ids": b["input_ids"]}
    if "pixel_values" in b:
        inputs.update(pixel_values=b["pixel_values"], image_grid_thw=b["image_grid_thw"])
    if "cu_seqlens" in b:
        inputs["position_ids"] = packed_position_ids(b)
    else:
        inputs.update(position_ids=b["position_ids"], attention_mask=b["attention_mask"])
    return inputs


def target_count(batches):
    return sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)


def token_loss_sum(model, b):
    """The next-token cross-entropy summed over the micro-batch's target tokens (HF's causal-LM loss
    before its division: the step divides by the global batch's target count)."""
    logits = model(**model_inputs(b), use_cache=False).logits
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), b["labels"][:, 1:].reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


if __name__ == "__main__":
    transformers.logging.set_verbosity_error()  # stdout carries the JSON lines only
    transformers.logging.disable_progress_bar()
    train(__doc__, "qwen2vl_transformers.py", "vlm_sft", load_model, target_count, token_loss_sum,
          lambda model, batches: sum(int(b["attention_mask"].sum()) for b in batches))
