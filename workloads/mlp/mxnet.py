from __future__ import annotations

from typing import Any

import numpy as np

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.mx_layers import gluon


def build(spec: ModelSpec) -> tuple[Any, dict[str, Any]]:
    hidden, n_in = spec.options["hidden"], int(np.prod(spec.sample_shape))
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(hidden, activation="relu", in_units=n_in),  # flattens C, H, W
            gluon.nn.Dense(hidden, activation="relu", in_units=hidden),
            gluon.nn.Dense(spec.num_classes, in_units=hidden))
    return net, {"fc1": net[0], "fc2": net[1], "fc3": net[2]}
