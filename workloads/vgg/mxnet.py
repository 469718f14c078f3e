from __future__ import annotations

import math
from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.mx_layers import gluon
from hetbench.workloads.vgg import POOL


def build(spec: ModelSpec) -> tuple[Any, dict[str, Any]]:
    net = gluon.nn.HybridSequential()
    layers: dict[str, Any] = {}
    c_in, index = spec.sample_shape[0], 0
    for item in spec.options["convs"]:
        if item == POOL:
            net.add(gluon.nn.MaxPool2D(2, 2))  # 'valid' convention: floors, as torch does
            continue
        index += 1
        conv = gluon.nn.Conv2D(item, 3, padding=1, in_channels=c_in, activation="relu")
        net.add(conv)
        layers[f"conv{index}"] = conv
        c_in = item
    fan_in = math.prod(spec.options["features"])
    units = (*spec.options["fc"], spec.num_classes)
    for i, out in enumerate(units):
        # Dense flattens its (N, C, H, W) input in C, H, W order; ReLU on all but the classifier
        dense = gluon.nn.Dense(out, in_units=fan_in,
                               activation="relu" if i < len(units) - 1 else None)
        net.add(dense)
        layers[f"fc{i + 1}"] = dense
        fan_in = out
    return net, layers
