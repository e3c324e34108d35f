# What a checkpoint carries for transformers and what `loom export` makes of it:
# - every checkpoint holds preprocessor_config.json (the processor settings the samples were made
#   with), tokenizer_config.json and chat_template.json (a chat template that Jinja2 renders into
#   the token sequence Loom trained on), generation_config.json (the tokenizer's stop tokens), and
#   a config.json whose torch_dtype is the dtype of its weights (bf16 runs: bfloat16);
# - `loom export --dtype bf16 --max-shard-size` writes bf16 shards with model.safetensors.index.json
#   and no training state; loom forward gives the same logits from the sharded and the single-file
#   export, and a job with only init_from (no hf_config) trains the same from either;
# - `loom eval --checkpoint` and `loom export` take a run directory (its newest checkpoint).
source "$(dirname "$0")/lib.bash"
common=(--set training.steps=2 --set training.global_batch_size=8 --set training.micro_batch_size=8
        --set training.warmup_steps=1 --set training.save_every=0 --set data.packing=false)
small_job "${common[@]}" --set training.output_dir="$WORK/run" > "$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail train; }
small_job "${common[@]}" --set training.precision=bf16 --set training.output_dir="$WORK/bf16" > "$WORK/bf16.log" 2>&1 ||
  { cat "$WORK/bf16.log"; fail "bf16 train"; }
"$LOOM" data export "$SRC/configs/shapes-qwen2vl-tiny.yaml" "${common[@]}" --steps 1 --out "$WORK/data" \
  > "$WORK/data.log" 2>&1 || { cat "$WORK/data.log"; fail "data export"; }

CK="$WORK/run/step-00000002"
python3 - "$CK" "$WORK/bf16/step-00000002" "$WORK/data/steps/step-000001.safetensors" <<'PY'
import json, re, struct, sys
import jinja2
ck, bf16, step = sys.argv[1:]
pre = json.load(open(f"{ck}/preprocessor_config.json"))
assert pre["image_processor_type"] == "Qwen2VLImageProcessor" and pre["processor_class"] == "Qwen2VLProcessor", pre
assert pre["min_pixels"] == pre["max_pixels"] == 56 * 56, pre  # shapes_vqa's images are 56x56
assert (pre["patch_size"], pre["temporal_patch_size"], pre["merge_size"]) == (14, 2, 2), pre
assert abs(pre["image_mean"][0] - 0.48145466) < 1e-7 and abs(pre["image_std"][2] - 0.27577711) < 1e-7, pre
tok = json.load(open(f"{ck}/tokenizer_config.json"))
assert tok["tokenizer_class"] == "PreTrainedTokenizerFast" and tok["eos_token"] == "<|im_end|>", tok
assert json.load(open(f"{ck}/chat_template.json"))["chat_template"] == tok["chat_template"]
vocab = json.load(open(f"{ck}/tokenizer.json"))
ids = dict(vocab["model"]["vocab"])
specials = {t["content"]: t["id"] for t in vocab["added_tokens"]}
gen = json.load(open(f"{ck}/generation_config.json"))
assert gen["eos_token_id"][0] == ids["<|im_end|>"] and gen["bos_token_id"] == 0, gen
assert json.load(open(f"{ck}/config.json"))["torch_dtype"] == "float32"
assert json.load(open(f"{bf16}/config.json"))["torch_dtype"] == "bfloat16"

# The first training sample as Loom made it, and the same conversation through the chat template,
# tokenized as transformers does for this tokenizer (special tokens first, then WhitespaceSplit).
raw = open(step, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
begin, end = header["0.input_ids"]["data_offsets"]
row_len = header["0.input_ids"]["shape"][1]
row = list(struct.unpack(f"<{row_len}q", raw[8 + n + begin:8 + n + begin + 8 * row_len]))
words = {i: w for w, i in ids.items()}
trained = [words[i] for i in row]
while trained[-1] in ("<|endoftext|>", "<|im_end|>") and trained[-2] == trained[-1]:
    trained.pop()  # padding after the sample's final <|im_end|>
text = " ".join(trained)
question = text.split("<|vision_end|> ")[1].split(" <|im_end|>")[0]
answer = text.split("assistant ")[1].split(" <|im_end|>")[0]
rendered = jinja2.Template(tok["chat_template"]).render(
    messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]},
              {"role": "assistant", "content": answer}])
pattern = "(" + "|".join(re.escape(s) for s in specials) + ")"
tokens = [t for part in re.split(pattern, rendered) for t in ([part] if part in specials else part.split())]
collapsed = [w for k, w in enumerate(trained) if not (w == "<|image_pad|>" and trained[k - 1] == w)]
assert tokens == collapsed, (tokens, collapsed)
print(f"export: the chat template renders the trained sample ({len(tokens)} tokens, image pads collapsed)")
PY

# Export: bf16 shards of at most 100 kB (the model is ~1.2 MB in bf16), and one bf16 file.
"$LOOM" export "$WORK/run" --out "$WORK/sharded" --dtype bf16 --max-shard-size 100kB > "$WORK/export.log" 2>&1 ||
  { cat "$WORK/export.log"; fail "export sharded"; }
grep -q "exported [0-9]* tensors of $CK to $WORK/sharded" "$WORK/export.log" || { cat "$WORK/export.log"; fail "export line"; }
"$LOOM" export "$CK" --out "$WORK/single" --dtype bf16 > "$WORK/export1.log" 2>&1 || { cat "$WORK/export1.log"; fail "export"; }
if "$LOOM" export "$CK" --out "$WORK/single" > "$WORK/again.log" 2>&1; then fail "export over a full directory"; fi
grep -q "exists and is not an empty directory" "$WORK/again.log" || { cat "$WORK/again.log"; fail "no refusal"; }
if "$LOOM" export "$CK" --out "$WORK/x" --max-shard-size 5XB > "$WORK/size.log" 2>&1; then fail "bad size accepted"; fi
grep -q "export: --max-shard-size: '5XB' is not a size" "$WORK/size.log" || { cat "$WORK/size.log"; fail "bad size message"; }
python3 - "$WORK" <<'PY'
import json, os, struct, sys
work = sys.argv[1]
sharded, single = f"{work}/sharded", f"{work}/single"
files = sorted(os.listdir(sharded))
shards = [f for f in files if f.startswith("model-")]
assert len(shards) > 1 and "model.safetensors" not in files, files
for left in ("optimizer.safetensors", "trainer_state.json", "job.yaml"):
    assert left not in files, files
for kept in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.json",
             "preprocessor_config.json", "generation_config.json"):
    assert kept in files, (kept, files)
index = json.load(open(f"{sharded}/model.safetensors.index.json"))
names, total = {}, 0
for shard in shards:
    raw = open(f"{sharded}/{shard}", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = {k: v for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
    assert len(raw) - 8 - n <= 100_000 or len(header) == 1, (shard, len(raw))
    for name, entry in header.items():
        assert entry["dtype"] == "BF16", (name, entry)
        names[name] = shard
        total += entry["data_offsets"][1] - entry["data_offsets"][0]
assert index["weight_map"] == names and index["metadata"]["total_size"] == total, index
assert json.load(open(f"{sharded}/config.json"))["torch_dtype"] == "bfloat16"
print(f"export: {len(names)} bf16 tensors in {len(shards)} shards of at most 100 kB, no training state")
PY

# The same logits from the sharded and the single-file export.
cat > "$WORK/input.json" <<'JSON'
{"input_ids": [[7, 8, 9, 10, 11, 12]]}
JSON
for d in sharded single; do
  "$LOOM" forward --model "$WORK/$d" --input "$WORK/input.json" --out "$WORK/fwd-$d" > "$WORK/fwd-$d.log" 2>&1 ||
    { cat "$WORK/fwd-$d.log"; fail "forward $d"; }
done
cmp "$WORK/fwd-sharded/logits.bin" "$WORK/fwd-single/logits.bin" || fail "sharded and single-file logits differ"

# init_from alone (no model.hf_config): the config comes from the directory, the weights load the
# same from both, so the first step's loss is the same.
awk '/^  hf_config:/ {skip = 1; next} skip && /^    / {next} {skip = 0; print}' \
  "$SRC/configs/shapes-qwen2vl-tiny.yaml" > "$WORK/init.yaml"
! grep -q hf_config "$WORK/init.yaml" || fail "hf_config left in the job"
for d in sharded single; do
  "$LOOM" train "$WORK/init.yaml" "${common[@]}" --set training.steps=1 --set model.init_from="$WORK/$d" \
    --set training.threads=2 --set data.eval_samples=50 --set tools.progress_bar=false --set training.eval_every=0 \
    --set training.output_dir="$WORK/init-$d" > "$WORK/init-$d.log" 2>&1 || { cat "$WORK/init-$d.log"; fail "init_from $d"; }
  grep -q "loaded [0-9]* tensors from $WORK/$d" "$WORK/init-$d.log" || { cat "$WORK/init-$d.log"; fail "no load line"; }
done
a=$(grep -o '"loss":[^,]*' "$WORK/init-sharded/metrics.jsonl" | head -1)
b=$(grep -o '"loss":[^,]*' "$WORK/init-single/metrics.jsonl" | head -1)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "init_from losses differ: $a vs $b"
if "$LOOM" train "$WORK/init.yaml" --set training.steps=1 > "$WORK/noinit.log" 2>&1; then fail "no hf_config and no init_from"; fi
grep -q "missing required key 'model.hf_config'" "$WORK/noinit.log" || { cat "$WORK/noinit.log"; fail "message"; }

# eval takes the run directory.
"$LOOM" eval "$SRC/configs/shapes-qwen2vl-tiny.yaml" --checkpoint "$WORK/run" --set data.eval_samples=20 \
  --set training.threads=2 > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "eval of a run directory"; }
grep -q "loaded [0-9]* tensors from $CK" "$WORK/eval.log" || { cat "$WORK/eval.log"; fail "eval did not load the newest"; }
echo "export: sharded and single-file bf16 exports give the same logits and the same first step from init_from $a"
