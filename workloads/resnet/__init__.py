"""resnet: a CIFAR-style residual network (He et al. 2016, section 4.2): a 3x3 stem, three
stages of basic blocks at widths w, 2w, 4w (the 2nd and 3rd stage start with a stride-2
block whose shortcut is a 1x1 stride-2 projection), global average pooling, one dense layer.

Norm-free: no BatchNorm, which couples the samples of a slice and would make the gradient
depend on the partition. Each block is `relu(shortcut(x) + skip * conv2(relu(conv1(x))))`
with a learnable scalar `skip` initialised to 0 (SkipInit, De & Smith 2020): every block
starts as the identity, which is what BatchNorm's down-weighting of residual branches
achieves, so deep stacks train without normalisation. Convolutions pad 1 on every side
(the TensorFlow builder pads stride-2 convolutions explicitly: 'SAME' would pad them 0
before and 1 after; at stride 1 'SAME' is symmetric and much faster than explicit padding).

Sizes: tiny widths 4/8/16, one block per stage; small 16/32/64, one block (ResNet-8);
base 16/32/64, three blocks (ResNet-20).
"""

from __future__ import annotations

import math

from hetbench.workloads.models import ModelSpec, ParamSpec, Workload, check_size, conv, dense

WIDTHS = {"tiny": (4, 8, 16), "small": (16, 32, 64), "base": (16, 32, 64)}
BLOCKS = {"tiny": 1, "small": 1, "base": 3}
HE_GAIN = math.sqrt(6.0)  # He-uniform: bound sqrt(6 / fan_in) for ReLU layers


def block_names(size: str) -> list[tuple[str, int, int, int]]:
    """(name, in width, out width, stride) of every block, in order."""
    widths, out, c_in = WIDTHS[size], [], WIDTHS[size][0]
    for stage, width in enumerate(widths):
        for b in range(BLOCKS[size]):
            stride = 2 if stage > 0 and b == 0 else 1
            out.append((f"s{stage + 1}b{b}", c_in, width, stride))
            c_in = width
    return out


def spec(size: str, sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    check_size("resnet", size)
    channels = sample_shape[0]
    widths = WIDTHS[size]
    params = conv("stem", channels, widths[0], gain=HE_GAIN)
    blocks = block_names(size)
    for name, c_in, c_out, stride in blocks:
        params += conv(f"{name}.conv1", c_in, c_out, gain=HE_GAIN)
        params += conv(f"{name}.conv2", c_out, c_out, gain=HE_GAIN)
        params.append(ParamSpec(f"{name}.skip", (1,), 0.0))
        if stride != 1 or c_in != c_out:
            params += conv(f"{name}.shortcut", c_in, c_out, kernel=1, bias=False)
    params += dense("fc", widths[-1], num_classes)
    return ModelSpec("resnet", sample_shape, num_classes, tuple(params),
                     {"widths": widths, "blocks": tuple(blocks)}, loss="classify", size=size)


WORKLOAD = Workload("resnet", ("scenes", "synthetic"), "classify", spec,
                    "CIFAR-style norm-free ResNet (SkipInit), 3 stages",
                    synthetic_shape=(3, 32, 32),
                    layers=lambda size: len(block_names(size)) + 2,  # stem, blocks, fc
                    fc_layers=lambda size: 1)
