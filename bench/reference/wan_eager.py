#!/usr/bin/env python3
"""The Wan2.1 DiT in PyTorch eager mode, written the way the official Wan2.1 code writes it
(wan/modules/model.py, WanModel t2v): the peer that `bench/compare` runs beside Loom's
flow-matching training.

It reads what `loom data export` writes for a flow_matching job (the DiT's initial weights and
config.json, the training settings, and each step's micro-batches: clean latents, padded text
features, noise levels and noise), builds the model from torch.nn modules with Wan's parameter
names, and trains it with torch.optim.AdamW: eager attention (matmul, softmax, matmul), no
flash-attn, no scaled_dot_product_attention, no compilation.

  wan_eager.py EXPORT_DIR [--steps N]                    print each step's loss (JSON lines)
  wan_eager.py EXPORT_DIR --bench --steps N --warmup W   time N steps after W, print one JSON

torch is all it needs: run it with the project virtualenv's Python (`.venv`, made by
`bash scripts/setup.sh`), as bench/compare does.
"""
import json
import math

import torch
import torch.nn as nn

from eager_training import load_weights, train



# --- the DiT ---------------------------------------------------------------------------------------

def sinusoidal_embedding_1d(dim, position):
    """[cos | sin] of t * 10000^(-i / (dim/2)), computed in float64 as Wan does: [B] -> [B, dim]."""
    half = dim // 2
    position = position.to(torch.float64)
    angles = torch.outer(position, torch.pow(10000, -torch.arange(half).to(position).div(half)))
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


def rope_params(max_seq_len, dim, theta=10000):
    """Unit complex rotations (complex128) [max_seq_len, dim/2] for one axis of the 3D RoPE."""
    angles = torch.outer(torch.arange(max_seq_len),
                         1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float64).div(dim)))
    return torch.polar(torch.ones_like(angles), angles)


def rope_apply(x, grid, freqs):
    """Rotate adjacent (interleaved) pairs of x [B, L, heads, head_dim] by the frame, row and column
    angles of each token, in float64 complex arithmetic as Wan does; every sample has the same grid."""
    b, length, n, c = x.size(0), x.size(1), x.size(2), x.size(3) // 2
    f, h, w = grid
    axes = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    table = torch.cat([axes[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
                       axes[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
                       axes[2][:w].view(1, 1, w, -1).expand(f, h, w, -1)], dim=-1).reshape(length, 1, -1)
    pairs = torch.view_as_complex(x.to(torch.float64).reshape(b, length, n, -1, 2))
    return torch.view_as_real(pairs * table).flatten(3).float()


def attention(q, k, v):
    """Plain float32 softmax(q k^T / sqrt(head_dim)) v over [B, L, heads, head_dim]; no mask (the
    self-attention has no padding, the cross-attention attends the text's zero rows too)."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    weights = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1))
    weights = torch.softmax(weights.float(), dim=-1).to(q.dtype)
    return torch.matmul(weights, v).transpose(1, 2).flatten(2)


class WanRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class WanLayerNorm(nn.LayerNorm):
    def __init__(self, dim, eps=1e-6, elementwise_affine=False):
        super().__init__(dim, elementwise_affine=elementwise_affine, eps=eps)

    def forward(self, x):
        return super().forward(x.float()).type_as(x)


class WanSelfAttention(nn.Module):
    def __init__(self, dim, num_heads, qk_norm=True, eps=1e-6):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        # RMSNorm over the full width (all heads together), before RoPE.
        self.norm_q = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()
        self.norm_k = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()

    def forward(self, x, grid, freqs):
        b, s, n, d = x.size(0), x.size(1), self.num_heads, self.head_dim
        q = self.norm_q(self.q(x)).view(b, s, n, d)
        k = self.norm_k(self.k(x)).view(b, s, n, d)
        v = self.v(x).view(b, s, n, d)
        return self.o(attention(rope_apply(q, grid, freqs), rope_apply(k, grid, freqs), v))


class WanT2VCrossAttention(WanSelfAttention):
    def forward(self, x, context):
        b, n, d = x.size(0), self.num_heads, self.head_dim
        q = self.norm_q(self.q(x)).view(b, -1, n, d)
        k = self.norm_k(self.k(context)).view(b, -1, n, d)
        v = self.v(context).view(b, -1, n, d)
        return self.o(attention(q, k, v))


class WanAttentionBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        dim, eps = c["dim"], c["eps"]
        self.norm1 = WanLayerNorm(dim, eps)
        self.self_attn = WanSelfAttention(dim, c["num_heads"], c["qk_norm"], eps)
        self.norm3 = WanLayerNorm(dim, eps, elementwise_affine=True) if c["cross_attn_norm"] else nn.Identity()
        self.cross_attn = WanT2VCrossAttention(dim, c["num_heads"], c["qk_norm"], eps)
        self.norm2 = WanLayerNorm(dim, eps)
        self.ffn = nn.Sequential(nn.Linear(dim, c["ffn_dim"]), nn.GELU(approximate="tanh"),
                                 nn.Linear(c["ffn_dim"], dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)

    def forward(self, x, e0, grid, freqs, context):
        # shift, scale, gate of the self-attention; shift, scale, gate of the FFN: each [B, 1, dim]
        e = (self.modulation + e0).chunk(6, dim=1)
        y = self.self_attn(self.norm1(x).float() * (1 + e[1]) + e[0], grid, freqs)
        x = x + y * e[2]
        x = x + self.cross_attn(self.norm3(x), context)  # no gate
        y = self.ffn(self.norm2(x).float() * (1 + e[4]) + e[3])
        return x + y * e[5]


class Head(nn.Module):
    def __init__(self, dim, out_dim, patch_size, eps=1e-6):
        super().__init__()
        self.norm = WanLayerNorm(dim, eps)
        self.head = nn.Linear(dim, math.prod(patch_size) * out_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim ** 0.5)

    def forward(self, x, e):
        # shift, scale from the time embedding e [B, dim] itself, not from e0.
        e = (self.modulation + e.unsqueeze(1)).chunk(2, dim=1)
        return self.head(self.norm(x) * (1 + e[1]) + e[0])


class WanModel(nn.Module):
    """WanModel (t2v) from its config.json; forward(x [B, C_in, T, H, W], t [B], text [B, <=text_len,
    text_dim]) -> the predicted velocity [B, C_out, T, H, W]. Every sample of a batch has one shape."""

    def __init__(self, c):
        super().__init__()
        if c.get("model_type", "t2v") != "t2v":
            raise ValueError(f"wan_eager.py: model_type {c['model_type']!r}; the reference is the t2v DiT")
        if list(c.get("window_size", [-1, -1])) != [-1, -1]:
            raise ValueError(f"wan_eager.py: window_size {c['window_size']}; the reference attends globally")
        self.patch_size = tuple(c["patch_size"])
        self.text_len, self.dim, self.freq_dim, self.out_dim = c["text_len"], c["dim"], c["freq_dim"], c["out_dim"]
        dim = c["dim"]
        self.patch_embedding = nn.Conv3d(c["in_dim"], dim, kernel_size=self.patch_size, stride=self.patch_size)
        self.text_embedding = nn.Sequential(nn.Linear(c["text_dim"], dim), nn.GELU(approximate="tanh"),
                                            nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(c["freq_dim"], dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.blocks = nn.ModuleList([WanAttentionBlock(c) for _ in range(c["num_layers"])])
        self.head = Head(dim, c["out_dim"], self.patch_size, c["eps"])
        # RoPE rotations: a plain attribute, not a buffer, as in Wan (not in the state dict).
        d = dim // c["num_heads"]
        self.freqs = torch.cat([rope_params(1024, d - 4 * (d // 6)), rope_params(1024, 2 * (d // 6)),
                                rope_params(1024, 2 * (d // 6))], dim=1)

    def forward(self, x, t, text):
        x = self.patch_embedding(x)  # [B, dim, f, h, w]
        grid = tuple(x.shape[2:])
        x = x.flatten(2).transpose(1, 2)  # [B, f*h*w, dim], tokens in (f, h, w) order
        e = self.time_embedding(sinusoidal_embedding_1d(self.freq_dim, t).float())  # [B, dim]
        e0 = self.time_projection(e).unflatten(1, (6, self.dim))  # [B, 6, dim]
        if text.size(1) < self.text_len:  # Wan pads every prompt with zero rows to text_len
            text = torch.cat([text, text.new_zeros(text.size(0), self.text_len - text.size(1), text.size(2))], 1)
        context = self.text_embedding(text)
        for block in self.blocks:
            x = block(x, e0, grid, self.freqs, context)
        return self.unpatchify(self.head(x, e), grid)

    def unpatchify(self, x, grid):
        """[B, f*h*w, pt*ph*pw*C] -> [B, C, f*pt, h*ph, w*pw]."""
        b, c = x.size(0), self.out_dim
        x = x.reshape(b, *grid, *self.patch_size, c)
        x = torch.einsum("bfhwpqrc->bcfphqwr", x)
        return x.reshape(b, c, *[g * p for g, p in zip(grid, self.patch_size)])


# --- training ------------------------------------------------------------------------------------

def velocity_error(model, b):
    """Sum of squared errors of the predicted velocity on one micro-batch, as Loom's task computes it:
    x_t = (1 - s) x0 + s noise with s in float32, t = 1000 s in float64, target noise - x0."""
    x0, noise, sigma = b["x0"].float(), b["noise"].float(), b["sigma"].double()
    s = sigma.float().view(-1, *[1] * (x0.dim() - 1))
    xt = (1 - s) * x0 + s * noise
    velocity = model(xt, sigma * 1000.0, b["text"].float())
    return (velocity.float() - (noise - x0)).pow(2).sum()


def patch_tokens(batches, patch_size):
    """The DiT's tokens, B (T/pt)(H/ph)(W/pw) per micro-batch, as Loom counts them."""
    pt, ph, pw = patch_size
    return sum(x.size(0) * (x.size(2) // pt) * (x.size(3) // ph) * (x.size(4) // pw)
               for x in (b["x0"] for b in batches))


if __name__ == "__main__":
    train(__doc__, "wan_eager.py", "flow_matching",
          lambda model_dir: load_weights(WanModel(json.load(open(f"{model_dir}/config.json"))),
                                         f"{model_dir}/model.safetensors"),
          lambda batches: sum(b["noise"].numel() for b in batches),  # the latent elements
          velocity_error, lambda model, batches: patch_tokens(batches, model.patch_size))
