from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.transformer import MASK_BIAS


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, scale: float) -> None:
        super().__init__()
        self.heads, self.scale = heads, scale
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor, keys: torch.Tensor, bias: torch.Tensor | None
                ) -> torch.Tensor:
        """x (N, Lq, d) attends to keys (N, Lk, d); bias (None: no mask) broadcasts to
        (N, heads, Lq, Lk)."""
        n, lq, d = x.shape
        lk, h = keys.shape[1], self.heads

        def split(t: torch.Tensor, length: int) -> torch.Tensor:
            return t.view(n, length, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x), lq), split(self.k(keys), lk), split(self.v(keys), lk)
        scores = q @ k.transpose(2, 3) * self.scale
        weights = torch.softmax(scores if bias is None else scores + bias, dim=-1)
        return self.o((weights @ v).transpose(1, 2).reshape(n, lq, d))


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int, scale: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, scale)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, bias)
        return x + self.ff2(F.relu(self.ff1(self.ln2(x))))


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int, scale: float) -> None:
        super().__init__()
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.self, self.cross = Attention(d, heads, scale), Attention(d, heads, scale)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, y: torch.Tensor, memory: torch.Tensor, causal: torch.Tensor,
                source_bias: torch.Tensor) -> torch.Tensor:
        h = self.ln1(y)
        y = y + self.self(h, h, causal)
        y = y + self.cross(self.ln2(y), memory, source_bias)
        return y + self.ff2(F.relu(self.ff1(self.ln3(y))))


def padding_bias(tokens: torch.Tensor, pad: int) -> torch.Tensor:
    """(N, 1, 1, L): MASK_BIAS on padded keys."""
    return ((tokens == pad).to(torch.float32) * MASK_BIAS)[:, None, None, :]


def causal_bias(length: int, device: torch.device) -> torch.Tensor:
    """(L, L): MASK_BIAS above the diagonal (a position attends to itself and before)."""
    return torch.triu(torch.full((length, length), MASK_BIAS, device=device), diagonal=1)


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        o = spec.options
        d, heads, ff, scale = o["d"], o["heads"], o["ff"], o["scale"]
        self.src_len, self.pad, self.layers = o["src_len"], o["pad"], o["layers"]
        self.src_embed = nn.Embedding(o["src_vocab"], d)
        self.src_pos = nn.Embedding(o["src_len"], d)
        self.tgt_embed = nn.Embedding(spec.num_classes, d)
        self.tgt_pos = nn.Embedding(o["tgt_len"], d)
        for i in range(self.layers):  # attribute names are the spec's parameter prefixes
            setattr(self, f"enc{i}", EncoderLayer(d, heads, ff, scale))
            setattr(self, f"dec{i}", DecoderLayer(d, heads, ff, scale))
        self.enc_ln, self.dec_ln = nn.LayerNorm(d), nn.LayerNorm(d)
        self.out = nn.Linear(d, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        src, tgt = x[:, : self.src_len], x[:, self.src_len:]
        source_bias = padding_bias(src, self.pad)
        h = self.src_embed(src) + self.src_pos.weight
        for i in range(self.layers):
            h = getattr(self, f"enc{i}")(h, source_bias)
        memory = self.enc_ln(h)
        y = self.tgt_embed(tgt) + self.tgt_pos.weight
        causal = causal_bias(tgt.shape[1], x.device)
        for i in range(self.layers):
            y = getattr(self, f"dec{i}")(y, memory, causal, source_bias)
        return self.out(self.dec_ln(y))


def build(spec: ModelSpec) -> nn.Module:
    return Transformer(spec)
