from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.mx_layers import gluon


def build(spec: ModelSpec) -> tuple[Any, dict[str, Any]]:
    c_in, height, width = spec.sample_shape
    c1, c2 = spec.options["channels"]
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(c1, 3, padding=1, in_channels=c_in, activation="relu"),
            gluon.nn.MaxPool2D(2),
            gluon.nn.Conv2D(c2, 3, padding=1, in_channels=c1, activation="relu"),
            gluon.nn.MaxPool2D(2),
            gluon.nn.Dense(spec.num_classes, in_units=c2 * (height // 4) * (width // 4)))
    return net, {"conv1": net[0], "conv2": net[2], "fc": net[4]}
