"""transformer: an encoder-decoder for translation (Vaswani et al. 2017) with pre-layer
normalisation (Xiong et al. 2020: trains without a long warm-up), learned position
embeddings and ReLU feed-forward layers, trained with teacher forcing on the `numbers`
parallel corpus (English number words -> French number words).

Layer by layer (every builder follows this exactly):
    encoder layer: x += attn(ln1(x), keys ln1(x), source padding masked)
                   x += ff2(relu(ff1(ln2(x))))
    decoder layer: y += self(ln1(y), causal mask)
                   y += cross(ln2(y), keys enc_ln(encoder output), source padding masked)
                   y += ff2(relu(ff1(ln3(y))))
    logits = out(dec_ln(y))
Attention: q, k, v, o dense layers (d, d) with bias; heads split the width evenly; scores
q k^T / sqrt(d / heads) plus MASK_BIAS where masked, softmax over keys. LayerNorm eps 1e-5.

Input encoding (one int64 array per sample): the source tokens (padded with PAD), then the
decoder's input (BOS and the target shifted right, padded). Targets: the target tokens then
EOS, IGNORE where padded. Loss: per sample, the mean over its target tokens; the held-out
metric is token accuracy.

Sizes: tiny d 32, 2 heads, ff 64, 1+1 layers; small d 128, 4 heads, ff 512, 2+2 layers;
base d 256, 4 heads, ff 1024, 3+3 layers.
"""

from __future__ import annotations

import math

from hetbench.workloads import numbers
from hetbench.workloads.models import (
    ModelSpec,
    ParamSpec,
    Workload,
    check_size,
    dense,
    layer_norm,
)

WIDTHS = {"tiny": (32, 2, 64, 1), "small": (128, 4, 512, 2), "base": (256, 4, 1024, 3)}
MASK_BIAS = -1e9  # added to masked attention scores (not -inf: a 0 * inf is NaN)
EMBED_BOUND = 0.1


def attention(name: str, d: int) -> list[ParamSpec]:
    return [p for part in ("q", "k", "v", "o") for p in dense(f"{name}.{part}", d, d)]


def encoder_layer(name: str, d: int, ff: int) -> list[ParamSpec]:
    return (layer_norm(f"{name}.ln1", d) + attention(f"{name}.attn", d)
            + layer_norm(f"{name}.ln2", d) + dense(f"{name}.ff1", d, ff)
            + dense(f"{name}.ff2", ff, d))


def decoder_layer(name: str, d: int, ff: int) -> list[ParamSpec]:
    return (layer_norm(f"{name}.ln1", d) + attention(f"{name}.self", d)
            + layer_norm(f"{name}.ln2", d) + attention(f"{name}.cross", d)
            + layer_norm(f"{name}.ln3", d) + dense(f"{name}.ff1", d, ff)
            + dense(f"{name}.ff2", ff, d))


def spec(size: str, sample_shape: tuple[int, ...], num_classes: int,
         src_len: int = 0, src_vocab: int = 0) -> ModelSpec:
    check_size("transformer", size)

    src_len = src_len or numbers.SOURCE_LEN
    src_vocab = src_vocab or len(numbers.SOURCE_VOCAB)
    tgt_len = sample_shape[0] - src_len
    d, heads, ff, layers = WIDTHS[size]
    params = [ParamSpec("src_embed.weight", (src_vocab, d), EMBED_BOUND),
              ParamSpec("src_pos.weight", (src_len, d), EMBED_BOUND),
              ParamSpec("tgt_embed.weight", (num_classes, d), EMBED_BOUND),
              ParamSpec("tgt_pos.weight", (tgt_len, d), EMBED_BOUND)]
    for i in range(layers):
        params += encoder_layer(f"enc{i}", d, ff)
    params += layer_norm("enc_ln", d)
    for i in range(layers):
        params += decoder_layer(f"dec{i}", d, ff)
    params += layer_norm("dec_ln", d) + dense("out", d, num_classes)
    return ModelSpec("transformer", sample_shape, num_classes, tuple(params),
                     {"d": d, "heads": heads, "ff": ff, "layers": layers, "src_len": src_len,
                      "tgt_len": tgt_len, "src_vocab": src_vocab, "pad": numbers.PAD,
                      "scale": 1.0 / math.sqrt(d // heads)},
                     loss="tokens", size=size, input_dtype="int64", target_shape=(tgt_len,))


WORKLOAD = Workload("transformer", ("numbers",), "tokens", spec,
                    "encoder-decoder translation (English to French number words)")
