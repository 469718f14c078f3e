"""vgg: a VGG-style network (Simonyan & Zisserman 2015) scaled to 32x32 images: stacks of
conv3x3(pad 1)+ReLU separated by 2x2 max pooling, then fully connected layers on the
flattened (C, H, W order) features. No BatchNorm, no dropout.

The fully connected layers hold most of the parameters and the convolutions most of the
compute (small: 0.79M of 0.81M parameters, 0.8M of 3.6M multiply-adds per image), which is
what the layer-placement study needs.

Sizes: tiny conv 8, M, 16, M, fc 64; small conv 16, M, 32, M, 64, M, fc 512, 512;
base conv 32, 32, M, 64, 64, M, 128, 128, M, fc 1024, 1024 (M: max pooling).
"""

from __future__ import annotations

import math

from hetbench.workloads.models import ModelSpec, Workload, check_size, conv, dense

POOL = 0  # marks a 2x2 max pooling in CONVS
CONVS = {"tiny": (8, POOL, 16, POOL), "small": (16, POOL, 32, POOL, 64, POOL),
         "base": (32, 32, POOL, 64, 64, POOL, 128, 128, POOL)}
FC = {"tiny": (64,), "small": (512, 512), "base": (1024, 1024)}
HE_GAIN = math.sqrt(6.0)


def spec(size: str, sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    check_size("vgg", size)
    c_in, height, width = sample_shape
    params, index = [], 0
    for item in CONVS[size]:
        if item == POOL:
            height, width = height // 2, width // 2
            continue
        index += 1
        params += conv(f"conv{index}", c_in, item, gain=HE_GAIN)
        c_in = item
    features = (c_in, height, width)
    fan_in = math.prod(features)
    for i, units in enumerate((*FC[size], num_classes)):
        params += dense(f"fc{i + 1}", fan_in, units)
        fan_in = units
    return ModelSpec("vgg", sample_shape, num_classes, tuple(params),
                     {"convs": CONVS[size], "fc": FC[size], "features": features},
                     loss="classify", size=size)


WORKLOAD = Workload("vgg", ("scenes", "synthetic"), "classify", spec,
                    "VGG-style conv stacks with large fully connected layers",
                    synthetic_shape=(3, 32, 32),
                    layers=lambda size: sum(c != POOL for c in CONVS[size]) + len(FC[size]) + 1,
                    fc_layers=lambda size: len(FC[size]) + 1)
