from __future__ import annotations

from typing import Any

import numpy as np

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.tf_layers import dense, tf
from hetbench.workloads.transformer import MASK_BIAS

NHWC = False  # token inputs
EPS = 1e-5  # torch's LayerNorm default


def layer_norm(v: dict[str, Any], name: str, x: Any) -> Any:
    """LayerNorm over the last axis, biased variance (as torch). moments() stops the
    gradient through the mean inside the variance: exact, as d var / d mean = 0."""
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + EPS) * v[f"{name}.weight"] + v[f"{name}.bias"]


def attention(v: dict[str, Any], name: str, x: Any, keys: Any, lq: int, lk: int, heads: int,
              scale: float, bias: Any | None) -> Any:
    """x (N*lq, d) attends to keys (N*lk, d); bias (None: no mask) broadcasts to
    (N, heads, lq, lk). Activations stay 2-D between layers so every dense layer is one
    MatMul (a 3-D x would run a broadcasting BatchMatMul whose kernel gradient is summed
    over the batch)."""
    d = x.shape[-1]

    def split(t: Any, length: int) -> Any:  # (N*L, d) -> (N, heads, L, d / heads)
        return tf.transpose(tf.reshape(t, (-1, length, heads, d // heads)), (0, 2, 1, 3))

    q = split(dense(v, f"{name}.q", x), lq)
    k = split(dense(v, f"{name}.k", keys), lk)
    values = split(dense(v, f"{name}.v", keys), lk)
    scores = tf.matmul(q, k, transpose_b=True) * scale  # scaled after q k^T, as torch
    if bias is not None:
        scores += bias
    out = tf.matmul(tf.nn.softmax(scores, axis=-1), values)  # (N, heads, lq, d / heads)
    return dense(v, f"{name}.o", tf.reshape(tf.transpose(out, (0, 2, 1, 3)), (-1, d)))


def feed_forward(v: dict[str, Any], name: str, x: Any) -> Any:
    return dense(v, f"{name}.ff2", tf.nn.relu(dense(v, f"{name}.ff1", x)))


def encoder_layer(v: dict[str, Any], name: str, x: Any, length: int, heads: int, scale: float,
                  bias: Any | None) -> Any:
    h = layer_norm(v, f"{name}.ln1", x)
    x = x + attention(v, f"{name}.attn", h, h, length, length, heads, scale, bias)
    return x + feed_forward(v, name, layer_norm(v, f"{name}.ln2", x))


def decoder_layer(v: dict[str, Any], name: str, y: Any, memory: Any, tgt_len: int,
                  src_len: int, heads: int, scale: float, causal: Any, source_bias: Any
                  ) -> Any:
    h = layer_norm(v, f"{name}.ln1", y)
    y = y + attention(v, f"{name}.self", h, h, tgt_len, tgt_len, heads, scale, causal)
    y = y + attention(v, f"{name}.cross", layer_norm(v, f"{name}.ln2", y), memory, tgt_len,
                      src_len, heads, scale, source_bias)
    return y + feed_forward(v, name, layer_norm(v, f"{name}.ln3", y))


def embed(v: dict[str, Any], table: str, positions: str, ids: Any, d: int) -> Any:
    """Token plus learned position embeddings, (N, L) ids -> (N*L, d)."""
    return tf.reshape(tf.gather(v[f"{table}.weight"], ids) + v[f"{positions}.weight"], (-1, d))


def logits(spec: ModelSpec, v: dict[str, Any], x: Any) -> Any:
    o = spec.options
    d, heads, scale, layers = o["d"], o["heads"], o["scale"], o["layers"]
    src_len, tgt_len = o["src_len"], o["tgt_len"]
    src, tgt = tf.split(x, [src_len, tgt_len], axis=1)
    # (N, 1, 1, src_len): MASK_BIAS on padded source keys
    source_bias = tf.reshape(tf.cast(tf.equal(src, o["pad"]), tf.float32) * MASK_BIAS,
                             (-1, 1, 1, src_len))
    h = embed(v, "src_embed", "src_pos", src, d)
    for i in range(layers):
        h = encoder_layer(v, f"enc{i}", h, src_len, heads, scale, source_bias)
    memory = layer_norm(v, "enc_ln", h)
    # (tgt_len, tgt_len): MASK_BIAS above the diagonal, a constant of the trace
    causal = tf.constant(np.triu(np.full((tgt_len, tgt_len), MASK_BIAS, np.float32), 1))
    y = embed(v, "tgt_embed", "tgt_pos", tgt, d)
    for i in range(layers):
        y = decoder_layer(v, f"dec{i}", y, memory, tgt_len, src_len, heads, scale, causal,
                          source_bias)
    out = dense(v, "out", layer_norm(v, "dec_ln", y))
    return tf.reshape(out, (-1, tgt_len, spec.num_classes))
