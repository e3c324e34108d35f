"""What Loom's PyTorch peers share (bench/reference/qwen2vl_transformers.py, wan_eager.py): reading what
`loom data export` writes, the learning-rate schedule, and the training loop with its timing, so the
peers differ only in their model and loss.
"""
import argparse
import json
import math
import os
import resource
import struct
import sys
import time

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        tensor = torch.frombuffer(raw, dtype=DTYPES[entry["dtype"]]) if raw else torch.empty(0, dtype=DTYPES[entry["dtype"]])
        out[name] = tensor.reshape(entry["shape"]).clone()
    return out


def load_weights(model, path, may_lack=()):
    """Loads the safetensors file at `path` into `model`, whose parameter names are the file's; every
    name must match but those in may_lack (a tied LM head the file may leave out)."""
    missing, unexpected = model.load_state_dict(load_safetensors(path), strict=False)
    missing = [m for m in missing if m not in may_lack]
    if missing or unexpected:
        sys.exit(f"{os.path.basename(sys.argv[0])}: the weights in {path} do not fit the model: "
                 f"missing {missing}, unexpected {unexpected}")
    return model


def learning_rate(step, s):
    warmup, total = s["warmup_steps"], s["steps"]
    if step < warmup:
        return s["lr"] * (step + 1) / warmup
    decay = max(1, total - max(0, warmup))
    progress = min(max((step - max(0, warmup)) / decay, 0.0), 1.0)
    return s["min_lr"] + 0.5 * (s["lr"] - s["min_lr"]) * (1.0 + math.cos(math.pi * progress))


def micro_batches(path):
    tensors = load_safetensors(path)
    batches = {}
    for name, tensor in tensors.items():
        index, field = name.split(".", 1)
        batches.setdefault(int(index), {})[field] = tensor
    return [batches[i] for i in sorted(batches)]


def train(doc, program, task, load_model, count_of, loss_of, tokens_of):
    """The peer's command line and training loop over an export of `task`.

    load_model(model_dir) -> the model holding the export's initial weights (model_dir holds
    config.json and model.safetensors); count_of(batches) -> what normalises the step's loss;
    loss_of(model, batch) -> one micro-batch's loss sum, a differentiable scalar. Each micro-batch's
    backward pass takes its sum / count as soon as it is computed (as Loom's trainer does), so the
    step's loss is the sum over its micro-batches / count.
    tokens_of(model, batches) -> the step's tokens as Loom's bench counts them."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir")
    parser.add_argument("--steps", type=int, default=None, help="steps to train (default: every exported one)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps first (with --bench)")
    parser.add_argument("--bench", action="store_true", help="time the steps and print one JSON object")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (default: the export's)")
    args = parser.parse_args()

    settings = json.load(open(f"{args.export_dir}/job.json"))
    if settings.get("task") != task:
        sys.exit(f"{program}: the reference trains {task} jobs; this export's task is {settings.get('task')}")
    if settings["precision"] != "fp32":
        sys.exit(f"{program}: the reference trains fp32 jobs; this one is {settings['precision']}")
    torch.set_num_threads(args.threads or settings["threads"])
    model = load_model(f"{args.export_dir}/model")
    model.train()

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=settings["lr"], betas=(settings["adam_beta1"], settings["adam_beta2"]),
                                  eps=settings["adam_eps"])
    exported = settings["exported_steps"]
    total = args.steps if args.steps is not None else exported
    if args.bench:
        total += args.warmup
    step_times, tokens = [], 0
    for step in range(total):
        batches = micro_batches(f"{args.export_dir}/steps/step-{step % exported + 1:06d}.safetensors")
        begin = time.perf_counter()
        lr = learning_rate(step, settings)
        for group in optimizer.param_groups:
            group["lr"] = lr
        count = count_of(batches)
        loss_sum = 0.0
        for b in batches:
            loss = loss_of(model, b)
            (loss / count).backward()
            loss_sum += loss.item()
        if settings["clip_grad"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings["clip_grad"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - begin
        if not args.bench:
            print(json.dumps({"step": step + 1, "loss": loss_sum / count, "lr": lr}), flush=True)
        elif step >= args.warmup:
            step_times.append(seconds)
            tokens += tokens_of(model, batches)
    if args.bench:
        step_times.sort()
        print(json.dumps({"steps": len(step_times), "warmup": args.warmup, "threads": torch.get_num_threads(),
                          "tokens_per_s": tokens / sum(step_times),
                          "step_time_median_s": step_times[len(step_times) // 2],
                          "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
