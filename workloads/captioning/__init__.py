"""captioning: a CNN encoder and an LSTM decoder that writes the caption of a `scenes` image
(Show and Tell, Vinyals et al. 2015, in miniature; the workload of Choi et al.'s
heterogeneous CPU+GPU study).

Encoder: conv3x3(pad 1)+ReLU+maxpool2 twice, conv3x3+ReLU, global average pooling: an
image feature f. The decoder's LSTM starts from h0 = tanh(init_h(f)), c0 = tanh(init_c(f))
and reads the caption's words (teacher forcing: BOS and the words); a dense layer predicts
the next word at every position. Loss per sample: the mean over its caption's words (EOS
included, padding IGNORE), so a long caption weighs as much as a short one and slices add up
exactly; the held-out metric is word accuracy.

Input encoding (one float32 array per sample, as the adapters move one array): the image's
3 x 32 x 32 pixels (C, H, W order), then the CAPTION_LEN - 1 decoder input word ids as
floats (exact: ids are below 2^24). Targets: the caption shifted left (words, EOS), IGNORE
on padding.

Sizes (conv widths; embedding, hidden): tiny 8/16/32; 16, 32; small 16/32/64; 32, 128;
base 32/64/128; 64, 512.
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
    conv,
    dense,
)

CONVS = {"tiny": (8, 16, 32), "small": (16, 32, 64), "base": (32, 64, 128)}
WIDTHS = {"tiny": (16, 32), "small": (32, 128), "base": (64, 512)}  # (embedding, hidden)
IMAGE_SHAPE = (3, 32, 32)
PIXELS = math.prod(IMAGE_SHAPE)
HE_GAIN = math.sqrt(6.0)


def spec(size: str, sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    check_size("captioning", size)
    (c1, c2, c3), (e, h) = CONVS[size], WIDTHS[size]
    steps = sample_shape[0] - PIXELS
    bound = 1.0 / math.sqrt(h)
    params = (conv("conv1", IMAGE_SHAPE[0], c1, gain=HE_GAIN) + conv("conv2", c1, c2, gain=HE_GAIN)
              + conv("conv3", c2, c3, gain=HE_GAIN) + dense("init_h", c3, h)
              + dense("init_c", c3, h))
    params += [ParamSpec("embed.weight", (num_classes, e), 0.1),
               ParamSpec("lstm.weight_ih", (4 * h, e), bound),
               ParamSpec("lstm.weight_hh", (4 * h, h), bound),
               ParamSpec("lstm.bias_ih", (4 * h,), bound),
               ParamSpec("lstm.bias_hh", (4 * h,), bound), *dense("out", h, num_classes)]
    return ModelSpec("captioning", sample_shape, num_classes, tuple(params),
                     {"convs": (c1, c2, c3), "embed": e, "hidden": h, "steps": steps,
                      "pixels": PIXELS, "image_shape": IMAGE_SHAPE},
                     loss="tokens", size=size, target_shape=(steps,))


def encode(images: np.ndarray, captions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) from scenes' images (N, 3, 32, 32) and captions (N, L) of ids
    (BOS, words, EOS, PAD=0)."""
    n = len(images)
    inputs = np.concatenate([images.reshape(n, -1),
                             captions[:, :-1].astype(np.float32)], axis=1)
    targets = np.where(captions[:, 1:] == 0, IGNORE, captions[:, 1:]).astype(np.int64)
    return np.ascontiguousarray(inputs, dtype=np.float32), targets


WORKLOAD = Workload("captioning", ("scenes",), "tokens", spec,
                    "CNN encoder and LSTM decoder writing scene captions")
