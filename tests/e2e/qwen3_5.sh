# Qwen3.5 trains as transformers computes it, and under data parallelism as in one process:
# - a tiny random dense Qwen3.5 made by transformers (the test ChatML tokenizer's vocabulary and vision
#   tokens) trains from its weights (model.init_from) on conversations with images and with videos
#   (frame lists of 6, 5, 2 and 1 frames, each temporal patch after its time); its first step's loss
#   equals transformers' loss on the same exported batches (each row alone, padding masked) within 1e-5;
# - 20 packed steps under dp=2, ZeRO-1, FSDP, pp=2 (cut between a linear-attention and a
#   full-attention layer), tp=2 and tp=2 with sequence parallelism give one process's losses within
#   1e-5 relative, and so do cp=2 and cp=4 (ring attention in the full-attention layers, the
#   linear-attention state passed along the ranks); so does the MoE model with output_router_logits
#   (its router loss in the loss, the routing counts carried across the stages and summed over the
#   ranks' tokens) under dp=2, pp=2, tp=2 (with and without SP), cp=2, cp=4, cp=2 x tp=2 with SP,
#   and expert parallelism over 2 and 4 ranks (8 experts, 2 a token; and ep=2 over 4 data ranks,
#   each expert's gradient summed over the 2 holding it, also under ZeRO-1; ep=2 x pp=2, also with
#   ZeRO-1, and under FSDP (its checkpoint resuming in one process); ep=2 x cp=2; ep=2 x tp=2 with SP, also with ZeRO-1 (its checkpoint resuming in one
#   process); ep=2 x tp=2 x pp=2 on 8 ranks; ep=4 with hot-expert replication, which lowers the most
#   loaded ep rank's rows over the mean),
#   loaded from transformers'
#   save_pretrained (the experts one by one), each step's expert_load (the experts' load) the same in
#   every layout; the step-20 weights of ep=2, ep=4, ep=2 x ZeRO-1 on 4 ranks and ep=2 x pp=2 are one process's
#   within 1e-5, and ep=4's
#   step-10 checkpoint resumes in one process and at ep=2 with one process's next losses; a capacity
#   with drops, the expert bias and the z-loss give one process's losses, drops and biases at ep=2 and
#   ep=2 x pp=2;
# - recompute (full with offload, and selective) gives the plain run's losses bit for bit;
# - transformers loads the trained checkpoint with no missing or unexpected keys, and AutoProcessor
#   makes its processor, whose video processor has the clip bounds the run trained with.
source "$(dirname "$0")/lib.bash"
FIX="$SRC/tests/fixtures/conversations"
Q35="$SRC/tests/fixtures/qwen3_5"
python3 - "$Q35" "$WORK" "$SRC/tests/fixtures/hf-qwen2-vl-video" <<'PY' || fail "making the HF models"
import json, sys
import torch
from safetensors.torch import save_file
import transformers
q35, work = sys.argv[1:3]
for variant, cls in (("dense", transformers.Qwen3_5ForConditionalGeneration),
                     ("moe", transformers.Qwen3_5MoeForConditionalGeneration)):
    config = json.load(open(f"{q35}/{variant}/config.json"))
    config["text_config"]["vocab_size"] = 268
    config["text_config"]["output_router_logits"] = variant == "moe"
    if variant == "moe":  # 8 experts, 2 a token: what expert parallelism over 2 and 4 ranks splits
        config["text_config"]["num_experts"] = 8
    config.update(image_token_id=265, video_token_id=266, vision_start_token_id=263, vision_end_token_id=264)
    model = cls(transformers.AutoConfig.for_model(**config))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.1)
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand_like(p) * 4 + 0.5))
            if name.endswith("linear_attn.norm.weight") or (name.startswith("model.visual") and "norm" in name):
                p.add_(1.0)
    out = f"{work}/init-{variant}"
    if variant == "moe":  # transformers' own save: mlp.experts.<e>.{gate,up,down}_proj.weight
        model.save_pretrained(out)
    else:
        model.config.save_pretrained(out)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/model.safetensors")
    open(f"{out}/preprocessor_config.json", "w").write(open(f"{q35}/{variant}/preprocessor_config.json").read())
rows = [{"messages": [{"role": "user", "content": "<image>What colour" + "?" * (i % 3)},
                      {"role": "assistant", "content": ["red", "blue", "a grey square"][i % 3]}],
         "images": [f"{q35}/dense/image.png"]} for i in range(16)]
with open(f"{work}/train-images.jsonl", "w") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
# Videos as frame lists (6 frames, 5 (the last repeated), 2 and 1), each temporal patch a block of its
# own after its time, among the images.
vid = sys.argv[3]
six = [f"{vid}/qwen2_vl/frame_00{i}.png" for i in range(6)]
five = [f"{vid}/qwen2_5_vl/frame_00{i}.png" for i in range(5)]
for at, frames, question, answer in ((1, six, "What moves?", "a shape"), (6, five, "Which way?", "left"),
                                     (9, six[:2], "Two frames?", "yes"), (13, five[4:], "One frame?", "still")):
    rows[at] = {"messages": [{"role": "user", "content": "<video>" + question},
                             {"role": "assistant", "content": answer}], "videos": [frames]}
with open(f"{work}/train.jsonl", "w") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
PY
# The MoE model trains on the image conversations only: top-k routing is discontinuous, and among the
# videos' extra tokens one whose router probabilities nearly tie picks another expert under another
# summation order (dp=2, step 9: one pick of one token, a 6.4e-5 loss difference that step).
# The models' weights are drawn at 0.1 (activations far from the defaults'), so lr 1e-4 keeps 20 Adam
# steps where the layouts' other summation orders stay near rounding: at 5e-4, tp=2 drifted to 1.1e-4
# by step 20 while agreeing at step 1 within 5e-8 (at 1e-4: 6e-7 over the 20 steps).
job() {  # variant, packing
  cat <<YAML
model: {family: qwen3_5$( [ "$1" = moe ] && echo _moe ), init_from: $WORK/init-$1}
data:
  dataset: messages
  tokenizer: $FIX/chatml_bpe_tokenizer.json
  datasets: [{path: $WORK/$( [ "$1" = moe ] && echo train-images || echo train ).jsonl}]
  packing: $2
  min_pixels: 1024
  max_pixels: 8192
  video_min_pixels: 4096          # a clip's pixels, every frame's together
  video_max_pixels: 16384
  video_fps: 2
  num_workers: 1
training: {steps: 20, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-4, warmup_steps: 2, precision: fp32,
           threads: 1, eval_every: 0, save_every: 0}
tools: {log_every: 1, progress_bar: false}
YAML
}
job dense false > "$WORK/first.yaml"
"$LOOM" train "$WORK/first.yaml" --set training.steps=1 --set training.output_dir="$WORK/first" > "$WORK/first.log" 2>&1 ||
  { cat "$WORK/first.log"; fail "first step"; }
"$LOOM" data export "$WORK/first.yaml" --out "$WORK/export" --steps 1 > "$WORK/export.log" 2>&1 ||
  { cat "$WORK/export.log"; fail "exporting the first step"; }
python3 - "$WORK" <<'PY' || fail "first step's loss differs from transformers'"
import json, sys
import torch
import transformers
from safetensors.torch import load_file
work = sys.argv[1]
model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(f"{work}/init-dense").float().eval()
batch = load_file(f"{work}/export/steps/step-000001.safetensors")
total, count = 0.0, 0
for m in sorted({k.split(".")[0] for k in batch}):
    ids, labels, mask = batch[f"{m}.input_ids"], batch[f"{m}.labels"], batch[f"{m}.attention_mask"]
    pixels, grids = batch.get(f"{m}.pixel_values"), batch.get(f"{m}.image_grid_thw")
    video_pixels, video_grids = batch.get(f"{m}.pixel_values_videos"), batch.get(f"{m}.video_grid_thw")
    image = video = 0
    for r in range(ids.shape[0]):  # each row alone, its padding cut
        n = int(mask[r].sum())
        row = ids[r:r + 1, :n]
        starts = row[0, :-1] == 263
        images = int((starts & (row[0, 1:] == 265)).sum())  # <|vision_start|><|image_pad|>: an image
        blocks = int((starts & (row[0, 1:] == 266)).sum())  # a video's temporal patch
        kwargs = {}
        if images:
            start, rows = int(grids[:image].prod(-1).sum()), int(grids[image:image + images].prod(-1).sum())
            kwargs.update(pixel_values=pixels[start:start + rows], image_grid_thw=grids[image:image + images])
            image += images
        if blocks:
            videos = patches = 0
            while patches < blocks:
                patches += int(video_grids[video + videos][0])
                videos += 1
            start = int(video_grids[:video].prod(-1).sum())
            rows = int(video_grids[video:video + videos].prod(-1).sum())
            kwargs.update(pixel_values_videos=video_pixels[start:start + rows],
                          video_grid_thw=video_grids[video:video + videos])
            video += videos
        types = (row == 265).long() + 2 * (row == 266).long()
        with torch.no_grad():
            logits = model(input_ids=row, mm_token_type_ids=types, **kwargs).logits[0]
        target = labels[r, 1:n]
        keep = target != -100
        total += torch.nn.functional.cross_entropy(logits[:-1][keep].double(), target[keep], reduction="sum").item()
        count += int(keep.sum())
hf = total / count
loom = next(json.loads(l)["loss"] for l in open(f"{work}/first/metrics.jsonl") if '"loss"' in l)
print(f"qwen3.5 first step: loom {loom:.8f} transformers {hf:.8f} relative difference {abs(loom - hf) / hf:.2e}")
assert abs(loom - hf) / hf < 1e-5
PY
for variant in dense moe; do
  job $variant true > "$WORK/$variant.yaml"
  "$LOOM" train "$WORK/$variant.yaml" --set training.output_dir="$WORK/$variant-one" \
    --set training.save_every=$( [ $variant = dense ] && echo 20 || echo 10 ) > "$WORK/$variant-one.log" 2>&1 ||
    { cat "$WORK/$variant-one.log"; fail "$variant one process"; }
  layouts="dp2 pp2 tp2 tp2sp cp2 cp4 cp2tp2sp ep2 ep4 ep4hot ep2dp4 ep2dp4zero1 ep2dp4fsdp ep2pp2 ep2pp2zero1 ep2cp2 ep2tp2sp ep2tp2spzero1 ep2tp2pp2"
  [ $variant = dense ] && layouts="dp2 zero1 fsdp pp2 tp2 tp2sp cp2 cp4"
  for layout in $layouts; do
    ranks=2
    case $layout in dp2) extra=();; zero1) extra=(--set parallel.zero=1);; fsdp) extra=(--set parallel.zero=3);;
      # The cut between layer 0 (linear attention) and layer 1 (full attention); the vision tower on stage 0.
      pp2) extra=(--set parallel.pp=2 --set "model.pipeline_layers={visual: [2, 0], llm: [1, 3]}");;
      tp2) extra=(--set parallel.tp=2);;
      tp2sp) extra=(--set parallel.tp=2 --set parallel.sequence_parallel=true);;
      cp2) extra=(--set parallel.cp=2);;
      cp4) extra=(--set parallel.cp=4); ranks=4;;
      cp2tp2sp) extra=(--set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true); ranks=4;;
      # Expert parallelism: each data rank holds 4 experts (ep2) or 2 (ep4, one sample a rank).
      ep2) extra=(--set parallel.ep=2 --set training.save_every=10);;
      ep4) extra=(--set parallel.ep=4 --set training.micro_batch_size=1 --set training.save_every=10); ranks=4;;
      # Hot-expert replication: a rank over 1.1x the mean rows copies its hottest expert to the least loaded.
      ep4hot) extra=(--set parallel.ep=4 --set parallel.hot_expert_threshold=1.1 --set training.micro_batch_size=1); ranks=4;;
      # ep=2 over 4 data ranks: each expert on two of them, its gradient summed over both.
      ep2dp4) extra=(--set parallel.ep=2 --set training.micro_batch_size=1); ranks=4;;
      # ZeRO-1 over each gradient group: the experts' state over their 2 expert-data ranks.
      ep2dp4zero1) extra=(--set parallel.ep=2 --set parallel.zero=1 --set training.micro_batch_size=1
                          --set training.save_every=10); ranks=4;;
      # FSDP over each gradient group: the experts' units over their 2 expert-data ranks.
      ep2dp4fsdp) extra=(--set parallel.ep=2 --set parallel.zero=3 --set training.micro_batch_size=1
                         --set training.save_every=10); ranks=4;;
      # Beside pipeline parallelism (each stage's experts split over its 2 data ranks) and context
      # parallelism (the ep ranks carved from the cp ranks of one sample).
      ep2pp2) extra=(--set parallel.ep=2 --set parallel.pp=2 --set "model.pipeline_layers={visual: [2, 0], llm: [1, 3]}"
                     --set training.save_every=10); ranks=4;;
      # ZeRO-1 over each stage's two groups: the experts' norm summed over ep and the stages.
      ep2pp2zero1) extra=(--set parallel.ep=2 --set parallel.pp=2 --set parallel.zero=1 --set training.micro_batch_size=1
                          --set "model.pipeline_layers={visual: [2, 0], llm: [1, 3]}"); ranks=4;;
      ep2cp2) extra=(--set parallel.ep=2 --set parallel.cp=2);;
      # Beside tensor parallelism with SP: each tp rank routes its chunk of the tokens to the ep peers of
      # its own tp rank, the experts' gradients summed over tp and over ep's data ranks.
      ep2tp2sp) extra=(--set parallel.ep=2 --set parallel.tp=2 --set parallel.sequence_parallel=true); ranks=4;;
      # ... with ZeRO-1 (each group's state over its own ranks, of the tensor-parallel slices), and beside
      # tp and pp together (8 ranks: the norm sums the slices over tp, the experts over ep, then the stages).
      ep2tp2spzero1) extra=(--set parallel.ep=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
                            --set parallel.zero=1 --set training.save_every=10); ranks=4;;
      ep2tp2pp2) extra=(--set parallel.ep=2 --set parallel.tp=2 --set parallel.pp=2
                        --set "model.pipeline_layers={visual: [2, 0], llm: [1, 3]}"); ranks=8;; esac
    "$LOOM" run -n $ranks -- "$LOOM" train "$WORK/$variant.yaml" --set training.output_dir="$WORK/$variant-$layout" \
      "${extra[@]}" > "$WORK/$variant-$layout.log" 2>&1 || { cat "$WORK/$variant-$layout.log"; fail "$variant $layout"; }
    # An expert-parallel run splits the experts: rank 0 holds 1/ep of them.
    case $layout in ep*) ep=${layout:2:1}
      grep -q "^\[rank 0\] info: expert parallelism (ep=$ep): this rank (expert rank 0) holds 1/$ep of every MoE layer's experts" \
        "$WORK/$variant-$layout.log" || { cat "$WORK/$variant-$layout.log"; fail "$variant $layout did not split the experts"; };; esac
  done
  python3 - "$WORK" "$SRC/tests/e2e" "$variant" $layouts <<'PY' || fail "$variant layouts differ from one process"
import sys
work, e2e, variant = sys.argv[1:4]
sys.path.insert(0, e2e)
from runs import steps
one = steps(f"{work}/{variant}-one/metrics.jsonl")
assert sorted(one) == list(range(1, 21)), sorted(one)
for layout in sys.argv[4:]:
    other = steps(f"{work}/{variant}-{layout}/metrics.jsonl")
    assert sorted(other) == list(range(1, 21)), (layout, sorted(other))
    worst = max(abs(one[s]["loss"] - other[s]["loss"]) / abs(one[s]["loss"]) for s in other)
    print(f"qwen3.5 {variant} {layout} vs one process: max relative loss difference {worst:.3e} over 20 steps")
    assert worst <= 1e-5, (layout, worst)
    if variant == "moe":  # the experts' load each step reports: the same picks, counted once
        assert all(abs(one[s]["expert_load"] - other[s]["expert_load"]) < 1e-9 for s in other), layout
        assert all(one[s]["expert_tokens"] == other[s]["expert_tokens"] for s in other), layout
if variant == "moe":
    for s in one:  # each expert's picks: 8 experts, their most over their mean is expert_load
        tokens = one[s]["expert_tokens"]
        assert len(tokens) == 8 and abs(max(tokens) / (sum(tokens) / 8) - one[s]["expert_load"]) < 1e-12, s
    loads = [one[s]["expert_load"] for s in sorted(one)]
    print(f"qwen3.5 moe expert_load (most tokens an expert got over the mean) {min(loads):.3f} to {max(loads):.3f}, "
          f"the same in every layout")
    # The ep ranks' load: the most rows a rank computed over the mean, without copies (ep4) and with
    # hot-expert replication (ep4hot), which must lower it.
    plain, hot = steps(f"{work}/moe-ep4/metrics.jsonl"), steps(f"{work}/moe-ep4hot/metrics.jsonl")
    assert all(abs(plain[s]["ep_rank_load"] - hot[s]["ep_rank_load_unreplicated"]) < 1e-9 for s in plain)
    assert all(plain[s]["ep_rank_load"] == plain[s]["ep_rank_load_unreplicated"] for s in plain)
    before = sum(hot[s]["ep_rank_load_unreplicated"] for s in hot) / 20
    after = sum(hot[s]["ep_rank_load"] for s in hot) / 20
    print(f"qwen3.5 moe ep=4 ranks' load (most rows over the mean, mean of 20 steps): {before:.3f} without "
          f"replication, {after:.3f} with hot-expert replication above 1.1")
    assert after < before
PY
done
# Expert parallelism's checkpoints: the step-20 weights of ep=2, ep=4, ep=2 x ZeRO-1 and ep=2 x pp=2 are one
# process's within 1e-5 (each expert whole, under the same names and shapes); the ep=4 checkpoint of
# step 10 resumes in one process and at ep=2, and the ep=2 x ZeRO-1 one (its optimizer state in two
# groups) at ep=4 with ZeRO-1, each with one process's losses of steps 11 to 20.
for resumed in ep1 ep2 ep4zero1 tp1 fsdp1; do
  from=moe-ep4 && [ $resumed = ep4zero1 ] && from=moe-ep2dp4zero1
  [ $resumed = tp1 ] && from=moe-ep2tp2spzero1
  [ $resumed = fsdp1 ] && from=moe-ep2dp4fsdp
  mkdir -p "$WORK/moe-resumed-$resumed" && cp -r "$WORK/$from/step-00000010" "$WORK/moe-resumed-$resumed/"
  run=("$LOOM" train "$WORK/moe.yaml" --set training.output_dir="$WORK/moe-resumed-$resumed")
  case $resumed in
    ep2) run=("$LOOM" run -n 2 -- "${run[@]}" --set parallel.ep=2);;
    ep4zero1) run=("$LOOM" run -n 4 -- "${run[@]}" --set parallel.ep=4 --set parallel.zero=1
                   --set training.micro_batch_size=1);; esac
  "${run[@]}" > "$WORK/moe-resumed-$resumed.log" 2>&1 || { cat "$WORK/moe-resumed-$resumed.log"; fail "resume at $resumed"; }
  grep -q "resum.*step-00000010" "$WORK/moe-resumed-$resumed.log" ||
    { cat "$WORK/moe-resumed-$resumed.log"; fail "no resume at $resumed"; }
done
python3 - "$WORK" "$SRC/tests/e2e" <<'PY' || fail "expert parallelism's checkpoints differ from one process's"
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from runs import steps, tensors
one = tensors(f"{work}/moe-one/step-00000020/model.safetensors")
for layout in ("ep2", "ep4", "ep4hot", "ep2dp4zero1", "ep2dp4fsdp", "ep2pp2"):
    theirs = tensors(f"{work}/moe-{layout}/step-00000020/model.safetensors")
    assert sorted(theirs) == sorted(one) and all(len(theirs[k]) == len(one[k]) for k in one), layout
    worst = max(max(abs(a - b) for a, b in zip(one[k], theirs[k])) / max(1.0, max(abs(a) for a in one[k]))
                for k in one)
    print(f"qwen3.5 moe {layout}: step-20 weights within {worst:.2e} of one process's (every tensor, whole)")
    assert worst <= 1e-5, (layout, worst)
reference = steps(f"{work}/moe-one/metrics.jsonl")
for resumed in ("ep1", "ep2", "ep4zero1", "tp1", "fsdp1"):
    run = steps(f"{work}/moe-resumed-{resumed}/metrics.jsonl")
    assert sorted(run) == list(range(11, 21)), (resumed, sorted(run))
    worst = max(abs(run[s]["loss"] - reference[s]["loss"]) / reference[s]["loss"] for s in run)
    origin = {"ep4zero1": "ep=2 x ZeRO-1", "tp1": "ep=2 x tp=2 (SP) x ZeRO-1",
              "fsdp1": "ep=2 x FSDP"}.get(resumed, "ep=4")
    target = {"ep1": "at ep=1", "ep2": "at ep=2", "ep4zero1": "at ep=4 with ZeRO-1"}.get(resumed, "in one process")
    print(f"qwen3.5 moe: the {origin} checkpoint of step 10 resumed {target}: "
          f"step 11 loss {run[11]['loss']:.8f} (one process {reference[11]['loss']:.8f}), "
          f"steps 11-20 within {worst:.2e}")
    assert worst <= 1e-5, (resumed, worst)
PY
# The routing choices together: a capacity of 1.25x the mean picks (its drops counted), the expert
# bias (moved by 1e-3 a step from every rank's picks) and the z-loss, in one process and under ep=2
# and ep=2 x pp=2 (each stage updating its layers' biases): the same losses within 1e-5, the same
# picks and drops each step, and the same biases at step 20. A capacity holds per micro-batch, so each
# micro-batch is one sample: every layout's micro-batches are then the same.
route=(--set training.moe_capacity_factor=1.25 --set training.moe_expert_bias_rate=1e-3 --set training.moe_z_loss=1e-3
       --set training.micro_batch_size=1)
for layout in one ep2 ep2pp2; do
  launch=() extra=()
  case $layout in ep2) launch=("$LOOM" run -n 2 --) extra=(--set parallel.ep=2);;
    ep2pp2) launch=("$LOOM" run -n 4 --)
            extra=(--set parallel.ep=2 --set parallel.pp=2 --set "model.pipeline_layers={visual: [2, 0], llm: [1, 3]}");; esac
  "${launch[@]}" "$LOOM" train "$WORK/moe.yaml" --set training.output_dir="$WORK/routed-$layout" "${route[@]}" \
    "${extra[@]}" > "$WORK/routed-$layout.log" 2>&1 || { cat "$WORK/routed-$layout.log"; fail "routed $layout"; }
done
python3 - "$WORK" "$SRC/tests/e2e" <<'PY' || fail "the routing choices differ between layouts"
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from runs import steps, tensors
plain, one = steps(f"{work}/moe-one/metrics.jsonl"), steps(f"{work}/routed-one/metrics.jsonl")
dropped = sum(one[s]["expert_dropped"] for s in one)
assert dropped > 0 and all(plain[s]["expert_dropped"] == 0 for s in plain), dropped
assert any(one[s]["loss"] != plain[s]["loss"] for s in one)
biases = {k: v for k, v in tensors(f"{work}/routed-one/step-00000020/model.safetensors").items() if "expert_bias" in k}
assert len(biases) == 4 and any(max(map(abs, b)) > 0 for b in biases.values()), biases
for layout in ("ep2", "ep2pp2"):
    other = steps(f"{work}/routed-{layout}/metrics.jsonl")
    assert sorted(other) == list(range(1, 21)), (layout, sorted(other))
    worst = max(abs(one[s]["loss"] - other[s]["loss"]) / one[s]["loss"] for s in one)
    assert all(one[s]["expert_tokens"] == other[s]["expert_tokens"] for s in one), layout
    assert all(one[s]["expert_dropped"] == other[s]["expert_dropped"] for s in one), layout
    theirs = tensors(f"{work}/routed-{layout}/step-00000020/model.safetensors")
    bias_gap = max(max(abs(a - b) for a, b in zip(biases[k], theirs[k])) for k in biases)
    print(f"qwen3.5 moe routed (capacity 1.25, expert bias, z-loss) {layout} vs one process: max relative loss "
          f"difference {worst:.3e} over 20 steps; {int(dropped)} picks dropped in all, the same each step; "
          f"step-20 expert biases within {bias_gap:.1e}")
    assert worst <= 1e-5 and bias_gap <= 1e-7, (layout, worst, bias_gap)
PY
# Recompute (full, with offload; selective) in one process: the plain run's losses bit for bit.
for memory in full selective; do
  extra=(--set features.recompute=$memory)
  [ $memory = full ] && extra+=(--set features.offload=true)
  "$LOOM" train "$WORK/dense.yaml" --set training.output_dir="$WORK/dense-$memory" "${extra[@]}" \
    > "$WORK/dense-$memory.log" 2>&1 || { cat "$WORK/dense-$memory.log"; fail "dense recompute $memory"; }
done
python3 - "$WORK" "$SRC/tests/e2e" <<'PY' || fail "recompute changes the losses"
import sys
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from runs import steps
one = steps(f"{work}/dense-one/metrics.jsonl")
for memory in ("full", "selective"):
    other = steps(f"{work}/dense-{memory}/metrics.jsonl")
    assert sorted(other) == sorted(one) and all(one[s]["loss"] == other[s]["loss"] for s in one), memory
    print(f"qwen3.5 dense recompute {memory}: the 20 losses bit for bit")
PY
python3 - "$WORK/dense-one/step-00000020" <<'PY' || fail "transformers does not load the checkpoint"
import sys
import transformers
model, info = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(sys.argv[1], output_loading_info=True)
assert not any(info.values()), info
processor = transformers.AutoProcessor.from_pretrained(sys.argv[1])
video = processor.video_processor  # the clip bounds it trained with
assert type(video).__name__ == "Qwen3VLVideoProcessor", type(video).__name__
assert (video.size["shortest_edge"], video.size["longest_edge"]) == (4096, 16384), video.size
print(f"transformers loads the checkpoint: no missing or unexpected keys; {type(processor).__name__} with "
      f"{type(video).__name__} at the clip bounds it trained with")
PY
echo "qwen3.5: the first step is transformers' loss; dp=2, ZeRO-1, FSDP, pp=2, tp=2, tp=2 + SP, cp=2 and cp=4 (and the MoE model's, its cp=2 x tp=2 + SP, and expert parallelism alone and beside ZeRO-1, pp and cp) match one process"
