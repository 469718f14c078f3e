from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.mx_layers import gluon
from hetbench.workloads.transformer import MASK_BIAS


class LayerNorm(gluon.nn.LayerNorm):
    """Gluon's LayerNorm at torch's epsilon, answering to the spec's "weight" and "bias"
    (its own names are gamma and beta; an ATTRIBUTES entry would rename Dense's too)."""

    def __init__(self, d: int) -> None:
        super().__init__(epsilon=1e-5, in_channels=d)

    @property
    def weight(self) -> gluon.Parameter:
        return self.gamma

    @property
    def bias(self) -> gluon.Parameter:
        return self.beta


class Positions(gluon.HybridBlock):
    """A learned (length, d) table added to every sample: the spec's "{name}.weight"."""

    def __init__(self, length: int, d: int) -> None:
        super().__init__()
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(length, d))

    def hybrid_forward(self, F: Any, x: Any, weight: Any) -> Any:  # noqa: N803
        return F.broadcast_add(x, F.expand_dims(weight, axis=0))


def dense(units: int, in_units: int) -> gluon.nn.Dense:
    # flatten=False: applied to the last axis of (N, L, in_units), as torch's Linear
    return gluon.nn.Dense(units, flatten=False, in_units=in_units)


class Attention(gluon.HybridBlock):
    def __init__(self, d: int, heads: int, scale: float) -> None:
        super().__init__()
        self.heads, self.scale = heads, scale
        with self.name_scope():
            self.q, self.k, self.v, self.o = (dense(d, d) for _ in range(4))

    def hybrid_forward(self, F: Any, x: Any, keys: Any,  # noqa: N803 - Gluon's signature
                       bias: Any = None) -> Any:
        """x (N, Lq, d) attends to keys (N, Lk, d); bias, if any, broadcasts to
        (N, heads, Lq, Lk)."""
        h = self.heads

        def split(t: Any) -> Any:  # (N, L, d) -> (N * heads, L, d / heads)
            t = F.transpose(F.reshape(t, shape=(0, 0, h, -1)), axes=(0, 2, 1, 3))
            return F.reshape(t, shape=(-3, 0, 0))

        q, k, v = split(self.q(x)), split(self.k(keys)), split(self.v(keys))
        scores = F.batch_dot(q, k, transpose_b=True) * self.scale
        if bias is not None:  # via (N, heads, Lq, Lk), where the masks broadcast
            scores = F.broadcast_add(F.reshape(scores, shape=(-4, -1, h, 0, 0)), bias)
            scores = F.reshape(scores, shape=(-3, 0, 0))
        out = F.batch_dot(F.softmax(scores, axis=-1), v)  # (N * heads, Lq, d / heads)
        out = F.transpose(F.reshape(out, shape=(-4, -1, h, 0, 0)), axes=(0, 2, 1, 3))
        return self.o(F.reshape(out, shape=(0, 0, -3)))


class EncoderLayer(gluon.HybridBlock):
    def __init__(self, d: int, heads: int, ff: int, scale: float) -> None:
        super().__init__()
        with self.name_scope():
            self.ln1, self.ln2 = LayerNorm(d), LayerNorm(d)
            self.attn = Attention(d, heads, scale)
            self.ff1, self.ff2 = dense(ff, d), dense(d, ff)

    def hybrid_forward(self, F: Any, x: Any, bias: Any = None) -> Any:  # noqa: N803
        h = self.ln1(x)
        x = x + self.attn(h, h, bias)
        return x + self.ff2(F.relu(self.ff1(self.ln2(x))))

    def layers(self, name: str) -> dict[str, Any]:
        """The spec's layer names under `name` -> the blocks owning them."""
        return {f"{name}.ln1": self.ln1, f"{name}.ln2": self.ln2, f"{name}.ff1": self.ff1,
                f"{name}.ff2": self.ff2, **attention_layers(f"{name}.attn", self.attn)}


class DecoderLayer(gluon.HybridBlock):
    def __init__(self, d: int, heads: int, ff: int, scale: float) -> None:
        super().__init__()
        with self.name_scope():
            self.ln1, self.ln2, self.ln3 = LayerNorm(d), LayerNorm(d), LayerNorm(d)
            self.self, self.cross = Attention(d, heads, scale), Attention(d, heads, scale)
            self.ff1, self.ff2 = dense(ff, d), dense(d, ff)

    def hybrid_forward(self, F: Any, y: Any, memory: Any, causal: Any,  # noqa: N803
                       source_bias: Any) -> Any:
        h = self.ln1(y)
        y = y + self.self(h, h, causal)
        y = y + self.cross(self.ln2(y), memory, source_bias)
        return y + self.ff2(F.relu(self.ff1(self.ln3(y))))

    def layers(self, name: str) -> dict[str, Any]:
        return {f"{name}.ln1": self.ln1, f"{name}.ln2": self.ln2, f"{name}.ln3": self.ln3,
                f"{name}.ff1": self.ff1, f"{name}.ff2": self.ff2,
                **attention_layers(f"{name}.self", self.self),
                **attention_layers(f"{name}.cross", self.cross)}


def attention_layers(name: str, attn: Attention) -> dict[str, Any]:
    return {f"{name}.{part}": getattr(attn, part) for part in ("q", "k", "v", "o")}


def padding_bias(F: Any, tokens: Any, pad: int) -> Any:  # noqa: N803
    """(N, 1, 1, L): MASK_BIAS on padded keys."""
    bias = F.cast(tokens == pad, "float32") * MASK_BIAS
    return F.reshape(bias, shape=(0, 1, 1, -1))


def causal_bias(F: Any, length: int) -> Any:  # noqa: N803
    """(1, 1, L, L): MASK_BIAS above the diagonal (a position attends to itself and before),
    built in the graph from the static length: a constant Parameter would have to be in
    the spec."""
    rows = F.reshape(F.arange(length), shape=(length, 1))
    cols = F.reshape(F.arange(length), shape=(1, length))
    return F.reshape(F.broadcast_greater(cols, rows) * MASK_BIAS, shape=(1, 1, length, length))


class Transformer(gluon.HybridBlock):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        o = spec.options
        d, heads, ff, scale = o["d"], o["heads"], o["ff"], o["scale"]
        self.src_len, self.tgt_len = o["src_len"], o["tgt_len"]
        self.pad, self.num_layers = o["pad"], o["layers"]
        with self.name_scope():
            self.src_embed = gluon.nn.Embedding(o["src_vocab"], d)
            self.src_pos = Positions(self.src_len, d)
            self.tgt_embed = gluon.nn.Embedding(spec.num_classes, d)
            self.tgt_pos = Positions(self.tgt_len, d)
            for i in range(self.num_layers):  # attribute names are the spec's prefixes
                setattr(self, f"enc{i}", EncoderLayer(d, heads, ff, scale))
                setattr(self, f"dec{i}", DecoderLayer(d, heads, ff, scale))
            self.enc_ln, self.dec_ln = LayerNorm(d), LayerNorm(d)
            self.out = dense(spec.num_classes, d)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803 - Gluon's signature
        src = F.slice_axis(x, axis=1, begin=0, end=self.src_len)
        tgt = F.slice_axis(x, axis=1, begin=self.src_len, end=None)
        source_bias = padding_bias(F, src, self.pad)
        h = self.src_pos(self.src_embed(src))
        for i in range(self.num_layers):
            h = getattr(self, f"enc{i}")(h, source_bias)
        memory = self.enc_ln(h)
        y = self.tgt_pos(self.tgt_embed(tgt))
        causal = causal_bias(F, self.tgt_len)
        for i in range(self.num_layers):
            y = getattr(self, f"dec{i}")(y, memory, causal, source_bias)
        return self.out(self.dec_ln(y))


def build(spec: ModelSpec) -> tuple[Any, dict[str, Any]]:
    net = Transformer(spec)
    layers: dict[str, Any] = {"src_embed": net.src_embed, "src_pos": net.src_pos,
                              "tgt_embed": net.tgt_embed, "tgt_pos": net.tgt_pos,
                              "enc_ln": net.enc_ln, "dec_ln": net.dec_ln, "out": net.out}
    for i in range(net.num_layers):
        layers.update(getattr(net, f"enc{i}").layers(f"enc{i}"))
        layers.update(getattr(net, f"dec{i}").layers(f"dec{i}"))
    return net, layers
