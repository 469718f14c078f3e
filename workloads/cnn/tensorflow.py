from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.tf_layers import Layout, dense, flatten_layout, tf

NHWC = True


def layouts(spec: ModelSpec) -> dict[str, Layout]:
    # the dense layer after the convolutions sees NHWC features in H, W, C order
    h, w = spec.sample_shape[1] // 4, spec.sample_shape[2] // 4
    return flatten_layout(spec, "fc.weight", spec.options["channels"][-1], h, w)


def logits(spec: ModelSpec, v: dict[str, Any], x: Any) -> Any:
    for name in ("conv1", "conv2"):
        x = tf.nn.conv2d(x, v[f"{name}.weight"], 1, "SAME") + v[f"{name}.bias"]
        x = tf.nn.max_pool2d(tf.nn.relu(x), 2, 2, "VALID")
    x = tf.reshape(x, (tf.shape(x)[0], -1))  # H, W, C order, as fc.weight's columns
    return dense(v, "fc", x)
