# Every YAML job snippet of README.md and docs/ loads and checks out as a job (`loom train --check`:
# config, data, tokenizer, model, init_from weights and layout, nothing trained), run from a
# directory that holds the files the snippets name (path/to/..., data/..., the repository's configs/
# and tests/). A snippet without a model section gets a tiny model matching its data's tokenizer; one
# without a training section gets `training: {steps: 1}`.
source "$(dirname "$0")/lib.bash"

LOOM=$(realpath "$LOOM"); SRC=$(realpath "$SRC")
cd "$WORK"
FIX="$SRC/tests/fixtures/conversations"
ln -s "$SRC/configs" configs
ln -s "$SRC/tests" tests
# path/to/model_dir: a checkpoint of the built-in tiny model, whose config.json is path/to/config.json.
small_job --set training.steps=1 --set data.eval_samples=1 --set training.output_dir="$WORK/seed" > seed.log 2>&1 ||
  { cat seed.log; fail "seed run"; }
mkdir -p path/to data/images
cp -r seed/step-00000001 path/to/model_dir
cp path/to/model_dir/config.json path/to/config.json
cp "$FIX/chatml_bpe_tokenizer.json" path/to/tokenizer.json
cp "$FIX/images/red.png" data/images/red.png
cat > data/captions.jsonl <<'JSONL'
{"messages": [{"role": "user", "content": "<image>Shape?"}, {"role": "assistant", "content": "square"}], "images": ["red.png"]}
JSONL
cat > data/chat.json <<'JSON'
[{"conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Hello!"}]}]
JSON
echo '{"messages": [{"role": "user", "content": "Say ok."}, {"role": "assistant", "content": "ok"}]}' > data/held_out.jsonl
# A LLaMA-Factory registry (docs/llamafactory.md): a sharegpt entry with role/content tags, an alpaca
# one and an openai one; media paths relative to the registry's directory.
cat > data/mllm_demo.json <<'JSON'
[{"messages": [{"role": "user", "content": "<image>Shape?"}, {"role": "assistant", "content": "square"}], "images": ["images/red.png"]}]
JSON
echo '[{"instruction": "Who are you?", "input": "", "output": "A tiny model."}]' > data/identity.json
cat > data/dataset_info.json <<'JSON'
{"mllm_demo": {"file_name": "mllm_demo.json", "formatting": "sharegpt",
               "columns": {"messages": "messages", "images": "images"},
               "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}},
 "identity": {"file_name": "identity.json"},
 "my_held_out": {"file_name": "held_out.jsonl", "formatting": "openai"}}
JSON
cat > messages_model.yaml <<'YAML'
model:
  family: qwen2_vl
  hf_config:
    model_type: qwen2_vl
    vocab_size: 267
    hidden_size: 64
    intermediate_size: 128
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    rope_scaling: {type: mrope, mrope_section: [2, 3, 3]}
    vision_start_token_id: 263
    vision_end_token_id: 264
    image_token_id: 265
    video_token_id: 266
    vision_config: {depth: 1, embed_dim: 32, num_heads: 2, mlp_ratio: 2, hidden_size: 64}
YAML
python3 - "$SRC" <<'PY'
import pathlib, re, sys
src = pathlib.Path(sys.argv[1])
count = 0
for doc in [src / "README.md", *sorted((src / "docs").glob("*.md"))]:
    for n, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
        sections = set(re.findall(r"^([a-z_]+):", block, re.M))
        text = block
        if "model" not in sections:
            text = open("messages_model.yaml").read() + text
        if "training" not in sections:
            text += "training: {steps: 1}\n"
        name = f"snippet-{doc.stem}-{n}.yaml"
        open(name, "w").write(text)
        print(name, doc.relative_to(src))
        count += 1
assert count >= 3, count
PY
for snippet in snippet-*.yaml; do
  "$LOOM" train "$snippet" --check > "$snippet.log" 2>&1 || { cat "$snippet" "$snippet.log"; fail "$snippet does not check out"; }
  grep -q "the job checks out" "$snippet.log" || { cat "$snippet.log"; fail "$snippet: no check line"; }
done
[ ! -e runs ] || fail "loom train --check wrote $(ls runs)"
# --check finds what training would: a snippet naming a missing file fails.
sed 's|path/to/config.json|path/to/missing.json|' snippet-README-0.yaml > bad.yaml
if "$LOOM" train bad.yaml --check > bad.log 2>&1; then fail "--check passed a job whose hf_config is missing"; fi
grep -q "missing.json" bad.log || { cat bad.log; fail "the error does not name the missing file"; }
echo "doc snippets: $(ls snippet-*.yaml | wc -l) YAML snippets of README.md and docs/ check out as jobs"
