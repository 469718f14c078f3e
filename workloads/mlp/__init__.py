"""mlp: in -> hidden -> hidden -> classes, ReLU, on flattened images (C, H, W order)."""

from __future__ import annotations

import math

from hetbench.workloads.models import ModelSpec, Workload, check_size, dense

HIDDEN = {"tiny": 64, "small": 256, "base": 1024}


def spec(size: str, sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    check_size("mlp", size)
    n_in, hidden = math.prod(sample_shape), HIDDEN[size]
    params = dense("fc1", n_in, hidden) + dense("fc2", hidden, hidden) + dense(
        "fc3", hidden, num_classes)
    return ModelSpec("mlp", sample_shape, num_classes, tuple(params), {"hidden": hidden},
                     loss="classify", size=size)


WORKLOAD = Workload("mlp", ("digits", "synthetic", "scenes"), "classify", spec,
                    "three dense layers on flattened images",
                    layers=lambda size: 3)
