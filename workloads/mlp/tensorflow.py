from __future__ import annotations

import math
from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.tf_layers import dense, tf

NHWC = False  # flattened in the data's C, H, W order, as fc1.weight's columns


def logits(spec: ModelSpec, v: dict[str, Any], x: Any) -> Any:
    x = tf.reshape(x, (-1, math.prod(spec.sample_shape)))
    x = tf.nn.relu(dense(v, "fc1", x))
    x = tf.nn.relu(dense(v, "fc2", x))
    return dense(v, "fc3", x)
