"""bert: a Transformer encoder trained with masked-language modelling (Devlin et al. 2019) on
64-character windows of Python standard-library source (the `text` data set), pre-layer
normalisation, learned positions, ReLU feed-forward, and an untied output layer over the
characters.

Masking (BERT's recipe): 15% of the positions of a sample are chosen; of those 80% become
MASK, 10% a random character, 10% stay; only chosen positions are predicted (other targets
are IGNORE); a sample with none chosen gets its first-drawn position. The draws for step s
are made for the whole global batch from (seed, s) and each worker takes its slice's rows,
so a sample's masking depends on (seed, step, position in the batch), never on the partition.
The held-out windows are masked once, with seed 0, so every run meets the same task. The
masking runs in the load phase of the step, like a real input pipeline's.

Sizes: tiny d 32, 2 heads, ff 64, 1 layer; small d 128, 4 heads, ff 512, 2 layers;
base d 256, 4 heads, ff 1024, 3 layers.
"""

from __future__ import annotations

import math

import numpy as np

from hetbench.workloads.models import (
    IGNORE,
    ModelSpec,
    ParamSpec,
    Workload,
    check_size,
    dense,
    layer_norm,
)
from hetbench.workloads.transformer import EMBED_BOUND, encoder_layer

WIDTHS = {"tiny": (32, 2, 64, 1), "small": (128, 4, 512, 2), "base": (256, 4, 1024, 3)}
MASK_SHARE = 0.15
HELDOUT_KEY = 0xE7A1  # the masking of the held-out split: fixed, seed 0


def spec(size: str, sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    check_size("bert", size)
    d, heads, ff, layers = WIDTHS[size]
    length = sample_shape[0]
    params = [ParamSpec("embed.weight", (num_classes + 1, d), EMBED_BOUND),  # + MASK
              ParamSpec("pos.weight", (length, d), EMBED_BOUND)]
    for i in range(layers):
        params += encoder_layer(f"enc{i}", d, ff)
    params += layer_norm("enc_ln", d) + dense("out", d, num_classes)
    return ModelSpec("bert", sample_shape, num_classes, tuple(params),
                     {"d": d, "heads": heads, "ff": ff, "layers": layers, "mask": num_classes,
                      "scale": 1.0 / math.sqrt(d // heads)},
                     loss="tokens", size=size, input_dtype="int64", target_shape=(length,))


def mask_batch(inputs: np.ndarray, targets: np.ndarray, seed: int, key: int, lo: int,
               total: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Mask rows lo..lo+len(inputs) of a batch of `total` samples drawn from (seed, key)."""
    rng = np.random.default_rng([seed, key, 0xB3A7])
    length = inputs.shape[1]
    choose = rng.random((total, length))[lo: lo + len(inputs)]
    kind = rng.random((total, length))[lo: lo + len(inputs)]
    noise = rng.integers(0, vocab, (total, length))[lo: lo + len(inputs)]
    chosen = choose < MASK_SHARE
    chosen[np.arange(len(inputs)), choose.argmin(axis=1)] = True  # at least one each
    masked = np.where(chosen & (kind < 0.8), vocab, inputs)  # MASK is id `vocab`
    masked = np.where(chosen & (kind >= 0.8) & (kind < 0.9), noise, masked)
    return masked, np.where(chosen, inputs, IGNORE)


def prepare(inputs: np.ndarray, targets: np.ndarray, seed: int, step: int, lo: int,
            total: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The training batch transform: the slice's rows of step `step`'s masking."""
    return mask_batch(inputs, targets, seed, step, lo, total, vocab)


def prepare_heldout(inputs: np.ndarray, targets: np.ndarray, vocab: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    return mask_batch(inputs, targets, 0, HELDOUT_KEY, 0, len(inputs), vocab)


WORKLOAD = Workload("bert", ("text", "synthetic"), "tokens", spec,
                    "Transformer encoder, masked-language modelling on characters",
                    prepare=prepare, prepare_heldout=prepare_heldout)
