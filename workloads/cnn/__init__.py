"""cnn: conv3x3(pad 1)-relu-maxpool2, twice, then one dense layer. No BatchNorm, no dropout."""

from __future__ import annotations

from hetbench.workloads.models import ModelSpec, Workload, check_size, conv, dense

CHANNELS = {"tiny": (8, 16), "small": (16, 32), "base": (64, 128)}


def spec(size: str, sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    check_size("cnn", size)
    channels, height, width = sample_shape
    c1, c2 = CHANNELS[size]
    params = conv("conv1", channels, c1) + conv("conv2", c1, c2)
    params += dense("fc", c2 * (height // 4) * (width // 4), num_classes)
    return ModelSpec("cnn", sample_shape, num_classes, tuple(params), {"channels": (c1, c2)},
                     loss="classify", size=size)


WORKLOAD = Workload("cnn", ("digits", "synthetic", "scenes"), "classify", spec,
                    "two conv+pool layers and a dense layer",
                    layers=lambda size: 3,
                    fc_layers=lambda size: 1)
