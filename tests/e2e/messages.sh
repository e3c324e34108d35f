# Training on the user's conversation files (data.dataset: messages): a JSONL file in the
# messages layout mixed with a ShareGPT-style file read through field names, a hand-made byte-level
# BPE tokenizer with Qwen2-VL's special tokens, images decoded from PNG and JPEG. Samples with a
# corrupt or a missing image are skipped and counted, a warning naming each once; a tiny model learns
# the replies (exact match on the held-out file), and the checkpoint carries the tokenizer.
source "$(dirname "$0")/lib.bash"
FIX="$SRC/tests/fixtures/conversations"
cat > "$WORK/train.jsonl" <<'JSONL'
{"messages": [{"role": "user", "content": "<image>Shape?"}, {"role": "assistant", "content": "square"}], "images": ["images/red.png"]}
{"messages": [{"role": "system", "content": "Short answers."}, {"role": "user", "content": "Sky<image>"}, {"role": "assistant", "content": "blue"}], "images": ["images/sky.jpg"]}
{"messages": [{"role": "user", "content": "Say ok."}, {"role": "assistant", "content": "ok"}]}
{"messages": [{"role": "user", "content": "<image>Tone?"}, {"role": "assistant", "content": "grey"}], "images": ["images/grey.png"]}
{"messages": [{"role": "user", "content": "<image>Broken?"}, {"role": "assistant", "content": "no"}], "images": ["images/corrupt.jpg"]}
{"messages": [{"role": "user", "content": "<image>Gone?"}, {"role": "assistant", "content": "no"}], "images": ["images/missing.png"]}
JSONL
cat > "$WORK/sharegpt.jsonl" <<'JSONL'
{"conversations": [{"from": "human", "value": "<image>Red?"}, {"from": "gpt", "value": "yes"}], "pictures": ["images/red.png"]}
{"conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Hello!"}]}
JSONL
# The held-out file: the usable samples of both, in the messages layout.
{ head -n 4 "$WORK/train.jsonl"
  echo '{"messages": [{"role": "user", "content": "<image>Red?"}, {"role": "assistant", "content": "yes"}], "images": ["images/red.png"]}'
  echo '{"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hello!"}]}'
} > "$WORK/eval.jsonl"
cat > "$WORK/job.yaml" <<YAML
$(tiny_chat_model)
data:
  dataset: messages
  tokenizer: $FIX/chatml_bpe_tokenizer.json
  datasets:
    - {path: $WORK/train.jsonl, root: $FIX, weight: 3.0}
    - path: $WORK/sharegpt.jsonl
      root: $FIX
      weight: 1.0
      fields: {messages: conversations, images: pictures, role: from, content: value, user: human, assistant: gpt}
  eval_datasets:
    - {path: $WORK/eval.jsonl, root: $FIX}
  eval_samples: 6
  max_pixels: 3136
  packing: true
training:
  steps: 150
  global_batch_size: 8
  micro_batch_size: 4
  lr: 3.0e-3
  warmup_steps: 10
  threads: 2
  output_dir: $WORK/run
tools:
  progress_bar: false
  log_every: 50
YAML
"$LOOM" train "$WORK/job.yaml" > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail train; }
python3 - "$WORK" <<'PY'
import json, re, sys
work = sys.argv[1]
log = open(f"{work}/train.log").read()
# An epoch of the mix is the 8 samples of both files: 6 positions for train.jsonl (weight 3), 2 for
# sharegpt.jsonl; a global batch of 8 is one epoch, so every step visits both bad samples once.
m = re.search(r"unusable samples skipped: (\d+)", log)
assert m and int(m.group(1)) == 2 * 150, (m and m.group(0), log[-2000:])
assert re.search(r"skipped sample 4 of \S*train.jsonl \(corrupt image\)", log), log[-3000:]
assert re.search(r"skipped sample 5 of \S*train.jsonl \(missing image\): image file \S*missing.png does not exist", log), log[-3000:]
# Each bad sample is named once, however many steps skip it again.
assert len(re.findall(r"skipped sample 4 of", log)) == 1 and len(re.findall(r"skipped sample 5 of", log)) == 1, log[-3000:]
m = re.search(r"eval: exact-match accuracy ([0-9.]+)% on 6 held-out questions", log)
assert m and float(m.group(1)) == 100.0, (m and m.group(0), log[-1500:])
PY
cmp -s "$WORK/run/step-00000150/tokenizer.json" "$FIX/chatml_bpe_tokenizer.json" || fail "the checkpoint lacks the tokenizer (as tokenizer.json)"
# The checkpoint's chat template (tokenizer_config.json), rendered by Jinja2, is the text whose
# tokens Loom's own chat template gives, system prompt and generation prompt included; an image
# placeholder becomes the vision tokens; max_pixels is the processor's.
cat > "$WORK/chat.json" <<'JSON'
[{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Bye"}]
JSON
"$LOOM" data tokenize --tokenizer "$FIX/chatml_bpe_tokenizer.json" --chat --add-generation-prompt \
  < "$WORK/chat.json" > "$WORK/chat_ids.json"
python3 - "$WORK/run/step-00000150" "$WORK/chat.json" > "$WORK/rendered.txt" <<'PY'
import json, sys
import jinja2
ck, chat = sys.argv[1:]
template = jinja2.Template(json.load(open(f"{ck}/tokenizer_config.json"))["chat_template"])
assert json.load(open(f"{ck}/preprocessor_config.json"))["max_pixels"] == 3136
image = template.render(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "<image>Red?"}])
assert image == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Red?<|im_end|>\n", image
sys.stdout.write(template.render(messages=json.load(open(chat)), add_generation_prompt=True))
PY
"$LOOM" data tokenize --tokenizer "$FIX/chatml_bpe_tokenizer.json" < "$WORK/rendered.txt" > "$WORK/rendered_ids.json"
cmp -s "$WORK/chat_ids.json" "$WORK/rendered_ids.json" ||
  fail "the saved chat template renders other tokens: $(cat "$WORK/rendered_ids.json") vs $(cat "$WORK/chat_ids.json")"
"$LOOM" eval "$WORK/job.yaml" --checkpoint "$WORK/run/step-00000150" --predictions "$WORK/predictions.jsonl" \
  > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail eval; }
python3 - "$WORK/predictions.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert [r["answer"] for r in rows] == ["square", "blue", "ok", "grey", "yes", "Hello!"], rows
assert all(r["predicted"] == r["answer"] for r in rows), rows
assert rows[1]["question"] == "Sky<image>" and rows[0]["question_type"] == "eval.jsonl", rows
PY
# loom generate answers the held-out prompts with the decoder the evaluation uses: the same answers,
# batched (left padding) or one by one; loom chat prints the same answer for one of them.
python3 - "$WORK/eval.jsonl" "$FIX" > "$WORK/prompts.jsonl" <<'PY'
import json, os, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    images = [os.path.abspath(f"{sys.argv[2]}/{p}") for p in row.get("images", [])]
    print(json.dumps({"messages": row["messages"][:-1], "images": images}))
PY
for batch in 1 4; do
  "$LOOM" generate "$WORK/run" --prompts "$WORK/prompts.jsonl" --out "$WORK/answers-$batch.jsonl" \
    --batch-size $batch --max-new-tokens 64 > "$WORK/generate.log" 2>&1 || { cat "$WORK/generate.log"; fail generate; }
done
python3 - "$WORK/predictions.jsonl" "$WORK/answers-1.jsonl" "$WORK/answers-4.jsonl" <<'PY'
import json, sys
predicted = [json.loads(line)["predicted"] for line in open(sys.argv[1])]
for path in sys.argv[2:]:
    rows = [json.loads(line) for line in open(path)]
    assert [r["index"] for r in rows] == list(range(6)), rows
    assert [r["answer"] + ("" if r["finished"] else " ...") for r in rows] == predicted, (path, rows, predicted)
PY
"$LOOM" chat "$WORK/run" --image "$FIX/images/red.png" --prompt "Red?" > "$WORK/chat.txt" 2> "$WORK/chat.log" ||
  { cat "$WORK/chat.log"; fail chat; }
[ "$(cat "$WORK/chat.txt")" = "yes" ] || fail "loom chat answered '$(cat "$WORK/chat.txt")', not 'yes'"
printf 'Say ok.\nHello\n' | "$LOOM" chat "$WORK/run/step-00000150" > "$WORK/turns.txt" 2> "$WORK/chat.log" ||
  { cat "$WORK/chat.log"; fail "chat from standard input"; }
[ "$(head -n 1 "$WORK/turns.txt")" = "ok" ] || fail "loom chat's first turn: $(cat "$WORK/turns.txt")"
# A held-out sample whose image is gone is a one-line error naming it, for `loom eval` and
# `loom train` alike, before any work (it used to crash the evaluation).
{ cat "$WORK/eval.jsonl"; echo '{"messages": [{"role": "user", "content": "<image>Gone?"}, {"role": "assistant", "content": "no"}], "images": ["images/missing.png"]}'; } > "$WORK/eval-bad.jsonl"
sed "s|$WORK/eval.jsonl|$WORK/eval-bad.jsonl|" "$WORK/job.yaml" > "$WORK/job-bad.yaml"
for command in eval train; do
  extra=(); [ "$command" = eval ] && extra=(--checkpoint "$WORK/run/step-00000150")
  if "$LOOM" "$command" "$WORK/job-bad.yaml" "${extra[@]}" --set training.output_dir="$WORK/bad" > "$WORK/bad.log" 2>&1; then
    cat "$WORK/bad.log"; fail "$command accepted a held-out sample with a missing image"
  fi
  grep -qx "loom: error: held-out sample 6 of $WORK/eval-bad.jsonl cannot be used (missing image): image file $FIX/images/missing.png does not exist" "$WORK/bad.log" ||
    { cat "$WORK/bad.log"; fail "$command: no one-line error naming the bad held-out sample"; }
done
echo "messages: trained on a mixed conversation set, skipped and counted the bad samples, learned every reply"
