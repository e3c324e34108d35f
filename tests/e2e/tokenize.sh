# loom data tokenize: plain text against ids from the JavaScript Qwen3 encoder, --chat against the
# ChatML template rendered here in Python, and one-line errors with exit code 1.
source "$(dirname "$0")/lib.bash"
TOK="$SRC/tests/fixtures/tokenizers/qwen3_tokenizer.json"
EXPECTED="$SRC/tests/fixtures/tokenizers/qwen3_expected.json"

# Writes the text of each chosen fixture case to case_N.txt and its ids to case_N.ids (one JSON
# array), so the shell can pipe the exact bytes in: English, Chinese, emoji sequences, code, CRLF
# and blank lines, a combining accent (NFC), special tokens, the empty text.
CASES="0 2 9 10 16 22 29 35"
python3 - "$EXPECTED" "$WORK" $CASES <<'PY'
import json, sys
cases = json.load(open(sys.argv[1], encoding="utf-8"))["cases"]
for n in sys.argv[3:]:
    case = cases[int(n)]
    open(f"{sys.argv[2]}/case_{n}.txt", "wb").write(case["text"].encode("utf-8"))
    open(f"{sys.argv[2]}/case_{n}.ids", "w").write(json.dumps(case["ids"]))
PY
same_ids() {  # same_ids GOT_FILE WANT_FILE: both hold one JSON array of ints
  python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])) != json.load(open(sys.argv[2])))' "$1" "$2"
}
for n in $CASES; do
  "$LOOM" data tokenize --tokenizer "$TOK" < "$WORK/case_$n.txt" > "$WORK/got_$n" || fail "case $n: exit $?"
  [ "$(wc -l < "$WORK/got_$n")" -eq 1 ] || fail "case $n: output is not one line: $(cat "$WORK/got_$n")"
  same_ids "$WORK/got_$n" "$WORK/case_$n.ids" || fail "case $n: got $(cat "$WORK/got_$n"), want $(cat "$WORK/case_$n.ids")"
  echo "ok: case $n -> $(cat "$WORK/got_$n")"
done

# --chat. Fixture case 21 is the rendered text of one user turn "What is 2+2?" with the default system
# turn and the generation prompt; without the prompt the ids end before its last 3 ids
# (<|im_start|> assistant \n).
python3 - "$EXPECTED" "$WORK" <<'PY'
import json, sys
cases = json.load(open(sys.argv[1], encoding="utf-8"))["cases"]
ids = cases[21]["ids"]
assert cases[21]["text"].endswith("<|im_end|>\n<|im_start|>assistant\n")
work = sys.argv[2]
json.dump([{"role": "user", "content": "What is 2+2?"}], open(f"{work}/one_turn.json", "w"))
json.dump(ids, open(f"{work}/one_turn_prompt.ids", "w"))
# The same chat with the system turn written out and the user content as text parts.
json.dump({"messages": [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": [{"type": "text", "text": "What is "},
                                                     {"type": "text", "text": "2+2?"}]}]},
          open(f"{work}/explicit_system.json", "w"))
json.dump(ids[:-3], open(f"{work}/explicit_system.ids", "w"))
# A longer chat; its expected text is Qwen2-VL's template rendered here, encoded by plain tokenize.
messages = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "我们今天去公园散步，天气非常好。 What do you think?"},
            {"role": "assistant", "content": "It sounds lovely 😀\n\nEnjoy the walk."},
            {"role": "user", "content": "def f(x):\n    return -x\n"}]
json.dump(messages, open(f"{work}/multi_turn.json", "w"), ensure_ascii=False)
text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
open(f"{work}/multi_turn.txt", "wb").write(text.encode("utf-8"))
PY
"$LOOM" data tokenize --tokenizer "$TOK" --chat --add-generation-prompt < "$WORK/one_turn.json" > "$WORK/got" ||
  fail "--chat one turn: exit $?"
same_ids "$WORK/got" "$WORK/one_turn_prompt.ids" || fail "--chat one turn: got $(cat "$WORK/got")"
echo "ok: --chat --add-generation-prompt, default system turn -> $(cat "$WORK/got")"
"$LOOM" data tokenize --tokenizer "$TOK" --chat < "$WORK/explicit_system.json" > "$WORK/got" ||
  fail "--chat explicit system: exit $?"
same_ids "$WORK/got" "$WORK/explicit_system.ids" || fail "--chat explicit system: got $(cat "$WORK/got")"
echo "ok: --chat, system turn given, text parts -> $(cat "$WORK/got")"
"$LOOM" data tokenize --tokenizer "$TOK" < "$WORK/multi_turn.txt" > "$WORK/want" || fail "multi-turn text: exit $?"
"$LOOM" data tokenize --tokenizer "$TOK" --chat < "$WORK/multi_turn.json" > "$WORK/got" || fail "--chat multi-turn: exit $?"
same_ids "$WORK/got" "$WORK/want" || fail "--chat multi-turn: got $(cat "$WORK/got"), want $(cat "$WORK/want")"
echo "ok: --chat multi-turn matches the template rendered in Python"

# Errors: exit code 1 and one line that says what is wrong.
expect_error() {  # expect_error WANT INPUT_FILE ARGS...
  local want=$1 input=$2; shift 2
  set +e
  "$LOOM" data tokenize "$@" < "$input" > "$WORK/out" 2> "$WORK/err"
  local rc=$?
  set -e
  [ "$rc" -eq 1 ] || { cat "$WORK/err"; fail "exit code $rc, not 1, for $*"; }
  [ "$(wc -l < "$WORK/err")" -eq 1 ] || { cat "$WORK/err"; fail "error for $* is not one line"; }
  grep -qF -- "$want" "$WORK/err" || { cat "$WORK/err"; fail "error for $* does not mention '$want'"; }
  echo "ok: $* -> $(cat "$WORK/err")"
}
expect_error "$WORK/no_such_tokenizer.json" "$WORK/case_0.txt" --tokenizer "$WORK/no_such_tokenizer.json"
echo '[{"role": "user", "content": "<image>What is this?"}]' > "$WORK/image.json"
expect_error "<image> placeholder, which needs the image" "$WORK/image.json" --tokenizer "$TOK" --chat
echo '[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]' > "$WORK/image_part.json"
expect_error "image or video part, which needs the image" "$WORK/image_part.json" --tokenizer "$TOK" --chat
echo '[{"role": "user", "content": "unterminated' > "$WORK/bad.json"
expect_error "not valid JSON" "$WORK/bad.json" --tokenizer "$TOK" --chat
printf 'bad byte \xff here' > "$WORK/bad_utf8.txt"
expect_error "not valid UTF-8" "$WORK/bad_utf8.txt" --tokenizer "$TOK"
