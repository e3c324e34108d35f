# `loom shapes` lists the published 7B models without allocating them, with exact counts.
source "$(dirname "$0")/lib.bash"
"$LOOM" shapes qwen2-vl-7b | grep -qx "qwen2-vl-7b: 8291375616 parameters" || fail "Qwen2-VL-7B count"
"$LOOM" shapes qwen2.5-vl-7b | grep -qx "qwen2.5-vl-7b: 8292166656 parameters" || fail "Qwen2.5-VL-7B count"
"$LOOM" shapes qwen2-vl-7b --names > "$WORK/names"
grep -qxF "visual.patch_embed.proj.weight	[1280, 3, 2, 14, 14]" "$WORK/names" || fail "patch embed shape"
grep -qxF "lm_head.weight	[152064, 3584]" "$WORK/names" || fail "lm_head shape"
"$LOOM" shapes "$SRC/tests/fixtures/hf-qwen2-vl-tiny" --names | sed '$d' | sort > "$WORK/tiny"
cut -f1,2 "$SRC/tests/fixtures/hf-qwen2-vl-tiny/state_dict_names.txt" | sort > "$WORK/expected"
diff "$WORK/tiny" "$WORK/expected" || fail "tiny model names differ from HuggingFace's"
# The other families: umT5 (Wan's text encoder) by name and from a model directory.
"$LOOM" shapes umt5-xxl | grep -qx "umt5-xxl: 5680910336 parameters" || fail "umT5-XXL count"
"$LOOM" shapes "$SRC/tests/fixtures/umt5-tiny" --names | sed '$d' | sort > "$WORK/umt5"
cut -f1,2 "$SRC/tests/fixtures/umt5-tiny/state_dict.txt" | sort > "$WORK/expected"
diff "$WORK/umt5" "$WORK/expected" || fail "tiny umT5 names differ from HuggingFace's"
# Wan2.1's DiT at both published sizes, its VAE, and the tiny reference models' names as upstream's.
"$LOOM" shapes wan2.1-t2v-1.3b | grep -qx "wan2.1-t2v-1.3b: 1418996800 parameters" || fail "Wan2.1 1.3B count"
"$LOOM" shapes wan2.1-t2v-14b | grep -qx "wan2.1-t2v-14b: 14288491584 parameters" || fail "Wan2.1 14B count"
"$LOOM" shapes wan2.1-vae | grep -qx "wan2.1-vae: 126892531 parameters" || fail "Wan2.1 VAE count"
"$LOOM" shapes wan2.1-t2v-1.3b --names > "$WORK/wan"
grep -qxF "blocks.29.cross_attn.norm_k.weight	[1536]" "$WORK/wan" || fail "Wan 1.3B names"
for part in dit vae; do
  "$LOOM" shapes "$SRC/tests/fixtures/wan-tiny/$part" --names | sed '$d' | sort > "$WORK/wan-$part"
  sed "s/ \[/\t[/" "$SRC/tests/fixtures/wan-tiny/$part/state_dict.txt" | sort > "$WORK/expected"
  diff "$WORK/wan-$part" "$WORK/expected" || fail "tiny Wan $part names differ from upstream's"
done
# Qwen3.5: the count transformers' own model gives on the meta device (the published totals add the
# checkpoints' multi-token-prediction weights, which neither builds), and a tiny model's names as
# the safetensors transformers wrote (less its MTP tensor).
"$LOOM" shapes qwen3.5-0.8b | grep -qx "qwen3.5-0.8b: 852985920 parameters" || fail "Qwen3.5-0.8B count"
"$LOOM" shapes qwen3.5-35b-a3b | grep -qx "qwen3.5-35b-a3b: 35107181936 parameters" || fail "Qwen3.5-35B-A3B count"
for variant in dense moe; do
  "$LOOM" shapes "$SRC/tests/fixtures/qwen3_5/$variant" --names | sed '$d' | cut -f1 | sort > "$WORK/q35"
  python3 -c "import sys; from safetensors import safe_open; print('\n'.join(sorted(k for k in safe_open(sys.argv[1], 'np').keys() if not k.startswith('mtp.'))))" \
    "$SRC/tests/fixtures/qwen3_5/$variant/model.safetensors" > "$WORK/expected"
  diff "$WORK/q35" "$WORK/expected" || fail "Qwen3.5 $variant names differ from transformers'"
done
echo "shapes: counts and names match"
