# `loom forward` on the HuggingFace tiny Qwen2-VL fixture reproduces HuggingFace's logits and
# image embeddings (max abs difference 1e-4).
source "$(dirname "$0")/lib.bash"
FIX="$SRC/tests/fixtures/hf-qwen2-vl-tiny"
python3 - "$FIX/input.json" "$WORK/input.json" <<'PY'
import json, os, sys
src = json.load(open(sys.argv[1]))
fixture_dir = os.path.dirname(os.path.abspath(sys.argv[1]))
json.dump({"input_ids": src["input_ids"], "images": [os.path.join(fixture_dir, "image.png")]}, open(sys.argv[2], "w"))
PY
"$LOOM" forward --model "$FIX" --input "$WORK/input.json" --out "$WORK/out" || fail "forward failed"
python3 - "$WORK/out" "$FIX" <<'PY'
import json, struct, sys
out, fix = sys.argv[1], sys.argv[2]
def floats(path):
    data = open(path, "rb").read()
    return struct.unpack(f"<{len(data) // 4}f", data)
shapes = json.load(open(f"{out}/shapes.json"))
assert shapes["logits"] == [1, 21, 256], shapes
assert shapes["image_embeds"] == [6, 64], shapes
for name in ("logits.bin", "image_embeds.bin"):
    a, b = floats(f"{out}/{name}"), floats(f"{fix}/{name}")
    assert len(a) == len(b), name
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"{name}: max abs difference {diff:.2e}")
    assert diff < 1e-4, (name, diff)
PY
