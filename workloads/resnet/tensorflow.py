from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.tf_layers import dense, tf

NHWC = True

# PyTorch's padding=1 on every side, written out for the stride-2 convolutions: "SAME" pads
# a stride-2 3x3 convolution on an even input 0 before and 1 after, which shifts every
# window by a pixel. At stride 1 "SAME" pads 1 on each side, the same mathematics, and its
# forward + backward runs 1.4-1.7x faster on CPU than explicit padding (measured).
PAD1 = [[0, 0], [1, 1], [1, 1], [0, 0]]


def conv3x3(v: dict[str, Any], name: str, x: Any, stride: int = 1) -> Any:
    padding = "SAME" if stride == 1 else PAD1
    return tf.nn.conv2d(x, v[f"{name}.weight"], stride, padding) + v[f"{name}.bias"]


def block(v: dict[str, Any], name: str, x: Any, c_in: int, c_out: int, stride: int) -> Any:
    branch = conv3x3(v, f"{name}.conv2", tf.nn.relu(conv3x3(v, f"{name}.conv1", x, stride)))
    if stride != 1 or c_in != c_out:
        # 1x1 without padding: "VALID" samples pixels 0, s, 2s, ... and gives ceil(H / s)
        # rows, as PyTorch's floor((H - 1) / s) + 1
        x = tf.nn.conv2d(x, v[f"{name}.shortcut.weight"], stride, "VALID")
    return tf.nn.relu(x + v[f"{name}.skip"] * branch)


def logits(spec: ModelSpec, v: dict[str, Any], x: Any) -> Any:
    x = tf.nn.relu(conv3x3(v, "stem", x))
    for name, c_in, c_out, stride in spec.options["blocks"]:
        x = block(v, name, x, c_in, c_out, stride)
    return dense(v, "fc", tf.reduce_mean(x, axis=(1, 2)))  # global average pool over H, W
