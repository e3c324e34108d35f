#!/usr/bin/python3
"""Qwen2-VL in PyTorch eager mode, written the way HuggingFace transformers writes it: the peer
that `bench/compare` runs beside Loom.

It reads what `loom data export` writes (the job's initial weights and config.json, the training
settings, and each step's micro-batches with their M-RoPE position ids), builds the model from
torch.nn modules with HF's parameter names, and trains it with torch.optim.AdamW: eager attention
(matmul, additive mask, softmax, matmul), no fused kernels, no compilation.

  qwen2vl_eager.py EXPORT_DIR [--steps N]                    print each step's loss (JSON lines)
  qwen2vl_eager.py EXPORT_DIR --bench --steps N --warmup W   time N steps after W, print one JSON

Debian's python3-torch (1.13) is all it needs.
"""
import math

from eager_training import load_safetensors, train  # first: it settles OpenBLAS before torch loads

import torch  # noqa: E402 (after the environment is settled)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

IGNORE_INDEX = -100


# --- vision tower -------------------------------------------------------------------------------

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb_vision(tensor, freqs):
    orig_dtype = tensor.dtype
    tensor = tensor.float()
    cos = freqs.cos().unsqueeze(1).repeat(1, 1, 2).unsqueeze(0).float()
    sin = freqs.sin().unsqueeze(1).repeat(1, 1, 2).unsqueeze(0).float()
    return ((tensor * cos) + (rotate_half(tensor) * sin)).to(orig_dtype)


class VisionRotaryEmbedding(nn.Module):
    def __init__(self, dim, theta=10000.0):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)),
                             persistent=False)

    def forward(self, seqlen):
        seq = torch.arange(seqlen, dtype=self.inv_freq.dtype)
        return torch.outer(seq, self.inv_freq)


class PatchEmbed(nn.Module):
    def __init__(self, patch_size, temporal_patch_size, in_channels, embed_dim):
        super().__init__()
        self.shape = (-1, in_channels, temporal_patch_size, patch_size, patch_size)
        kernel = [temporal_patch_size, patch_size, patch_size]
        self.embed_dim = embed_dim
        self.proj = nn.Conv3d(in_channels, embed_dim, kernel_size=kernel, stride=kernel, bias=False)

    def forward(self, hidden_states):
        hidden_states = hidden_states.view(*self.shape).to(self.proj.weight.dtype)
        return self.proj(hidden_states).view(-1, self.embed_dim)


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class VisionMlp(nn.Module):
    def __init__(self, dim, hidden_dim, act):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = QuickGELU() if act == "quick_gelu" else nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class VisionAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states, cu_seqlens, rotary_pos_emb):
        seq_length = hidden_states.shape[0]
        q, k, v = self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q = apply_rotary_pos_emb_vision(q.unsqueeze(0), rotary_pos_emb).squeeze(0)
        k = apply_rotary_pos_emb_vision(k.unsqueeze(0), rotary_pos_emb).squeeze(0)
        attention_mask = torch.full([1, seq_length, seq_length], torch.finfo(q.dtype).min, dtype=q.dtype)
        for i in range(1, len(cu_seqlens)):
            a, b = cu_seqlens[i - 1], cu_seqlens[i]
            attention_mask[..., a:b, a:b] = 0
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        attn_weights = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(self.head_dim)
        attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
        attn_output = torch.matmul(attn_weights, v).transpose(0, 1).reshape(seq_length, -1)
        return self.proj(attn_output)


class VisionBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        dim = c["embed_dim"]
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, c["num_heads"])
        self.mlp = VisionMlp(dim, int(dim * c["mlp_ratio"]), c.get("hidden_act", "quick_gelu"))

    def forward(self, hidden_states, cu_seqlens, rotary_pos_emb):
        hidden_states = hidden_states + self.attn(self.norm1(hidden_states), cu_seqlens, rotary_pos_emb)
        return hidden_states + self.mlp(self.norm2(hidden_states))


class PatchMerger(nn.Module):
    def __init__(self, dim, context_dim, spatial_merge_size):
        super().__init__()
        self.hidden_size = context_dim * (spatial_merge_size ** 2)
        self.ln_q = nn.LayerNorm(context_dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.hidden_size, self.hidden_size), nn.GELU(),
                                 nn.Linear(self.hidden_size, dim))

    def forward(self, x):
        return self.mlp(self.ln_q(x).view(-1, self.hidden_size))


class VisionTransformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.spatial_merge_size = c["spatial_merge_size"]
        self.patch_embed = PatchEmbed(c["patch_size"], c["temporal_patch_size"], c["in_channels"], c["embed_dim"])
        self.rotary_pos_emb = VisionRotaryEmbedding(c["embed_dim"] // c["num_heads"] // 2)
        self.blocks = nn.ModuleList([VisionBlock(c) for _ in range(c["depth"])])
        self.merger = PatchMerger(c["hidden_size"], c["embed_dim"], c["spatial_merge_size"])

    def rot_pos_emb(self, grid_thw):
        pos_ids = []
        m = self.spatial_merge_size
        for t, h, w in grid_thw.tolist():
            hpos = torch.arange(h).unsqueeze(1).expand(-1, w)
            hpos = hpos.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
            wpos = torch.arange(w).unsqueeze(0).expand(h, -1)
            wpos = wpos.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
            pos_ids.append(torch.stack([hpos, wpos], dim=-1).repeat(t, 1))
        pos_ids = torch.cat(pos_ids, dim=0)
        full = self.rotary_pos_emb(int(grid_thw[:, 1:].max()))
        return full[pos_ids].flatten(1)

    def forward(self, hidden_states, grid_thw):
        hidden_states = self.patch_embed(hidden_states)
        rotary_pos_emb = self.rot_pos_emb(grid_thw)
        cu_seqlens = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0]).cumsum(0)
        cu_seqlens = [0] + cu_seqlens.tolist()
        for blk in self.blocks:
            hidden_states = blk(hidden_states, cu_seqlens, rotary_pos_emb)
        return self.merger(hidden_states)


# --- language model ------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, base):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)),
                             persistent=False)

    def forward(self, x, position_ids):
        # position_ids (3, B, L) -> cos, sin (3, B, L, D)
        inv_freq = self.inv_freq[None, None, :, None].float().expand(3, position_ids.shape[1], -1, 1)
        freqs = (inv_freq @ position_ids[:, :, None, :].float()).transpose(2, 3)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section):
    sections = mrope_section * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sections, dim=-1))], dim=-1).unsqueeze(1)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sections, dim=-1))], dim=-1).unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states, n_rep):
    batch, num_kv_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_kv_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_kv_heads * n_rep, slen, head_dim)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.num_heads = c["num_attention_heads"]
        self.num_kv_heads = c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.num_heads
        self.mrope_section = c["rope_scaling"]["mrope_section"]
        self.q_proj = nn.Linear(c["hidden_size"], self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(c["hidden_size"], self.num_kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(c["hidden_size"], self.num_kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, c["hidden_size"], bias=False)

    def forward(self, hidden_states, attention_mask, cos, sin):
        bsz, q_len, _ = hidden_states.size()
        q = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_multimodal_rotary_pos_emb(q, k, cos, sin, self.mrope_section)
        k = repeat_kv(k, self.num_heads // self.num_kv_heads)
        v = repeat_kv(v, self.num_heads // self.num_kv_heads)
        attn_weights = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
        attn_output = torch.matmul(attn_weights, v).transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], c["hidden_size"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = Mlp(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, hidden_states, attention_mask, cos, sin):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), attention_mask, cos, sin)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class TextModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.rotary_emb = RotaryEmbedding(c["hidden_size"] // c["num_attention_heads"], c["rope_theta"])

    def forward(self, inputs_embeds, attention_mask, position_ids):
        cos, sin = self.rotary_emb(inputs_embeds, position_ids)
        hidden_states = inputs_embeds
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, cos, sin)
        return self.norm(hidden_states)


class Qwen2VLForConditionalGeneration(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.visual = VisionTransformer(c["vision_config"])
        self.model = TextModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c.get("tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch):
        input_ids = batch["input_ids"]
        inputs_embeds = self.model.embed_tokens(input_ids)
        if "pixel_values" in batch:
            image_embeds = self.visual(batch["pixel_values"], batch["image_grid_thw"]).to(inputs_embeds.dtype)
            image_mask = (input_ids == self.config["image_token_id"]).unsqueeze(-1).expand_as(inputs_embeds)
            inputs_embeds = inputs_embeds.masked_scatter(image_mask, image_embeds)
        mask = attention_mask_4d(batch, inputs_embeds.dtype)
        hidden_states = self.model(inputs_embeds, mask, batch["position_ids"])
        return self.lm_head(hidden_states).float()


def attention_mask_4d(batch, dtype):
    """Additive (B, 1, L, L) mask: causal, and within one packed sample (cu_seqlens) or over the real
    tokens of a padded row."""
    bsz, length = batch["input_ids"].shape
    minimum = torch.finfo(dtype).min
    allowed = torch.ones(length, length, dtype=torch.bool).tril().expand(bsz, length, length).clone()
    if "cu_seqlens" in batch:
        segment = torch.zeros(length, dtype=torch.long)
        for i, start in enumerate(batch["cu_seqlens"].tolist()[1:-1]):
            segment[start:] = i + 1
        allowed &= (segment[:, None] == segment[None, :]).unsqueeze(0)
    else:
        allowed &= batch["attention_mask"].bool()[:, None, :]
    mask = torch.zeros(bsz, 1, length, length, dtype=dtype)
    return mask.masked_fill(~allowed.unsqueeze(1), minimum)


# --- training ------------------------------------------------------------------------------------

def build_model(config):
    # A tied model's file may leave the LM head out.
    may_lack = ["lm_head.weight"] if config.get("tie_word_embeddings") else []
    return Qwen2VLForConditionalGeneration(config), may_lack


def target_count(batches):
    return sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)


def token_loss_sum(model, b):
    """The next-token cross-entropy summed over the micro-batch's target tokens."""
    logits = model(b)
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), b["labels"][:, 1:].reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


if __name__ == "__main__":
    train(__doc__, "qwen2vl_eager.py", "vlm_sft", build_model, target_count, token_loss_sum,
          lambda model, batches: sum(int(b["attention_mask"].sum()) for b in batches))
