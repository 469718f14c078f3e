from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.mx_layers import gluon, mx


class Block(gluon.HybridBlock):
    """relu(shortcut(x) + skip * conv2(relu(conv1(x)))), the SkipInit basic block."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        with self.name_scope():
            self.conv1 = gluon.nn.Conv2D(c_out, 3, strides=stride, padding=1, in_channels=c_in)
            self.conv2 = gluon.nn.Conv2D(c_out, 3, padding=1, in_channels=c_out)
            # the block owns its scalar, so the spec's "{block}.skip" resolves to it
            self.skip = self.params.get("skip", shape=(1,), init=mx.init.Zero())
            self.shortcut = (gluon.nn.Conv2D(c_out, 1, strides=stride, use_bias=False,
                                             in_channels=c_in)
                             if stride != 1 or c_in != c_out else None)

    def hybrid_forward(self, F: Any, x: Any, skip: Any) -> Any:  # noqa: N803 - Gluon's signature
        branch = self.conv2(F.relu(self.conv1(x)))
        identity = x if self.shortcut is None else self.shortcut(x)
        # (1,) -> (1, 1, 1, 1): broadcast over N, C, H, W in NDArray and Symbol mode alike
        scale = F.reshape(skip, shape=(1, 1, 1, 1))
        return F.relu(identity + F.broadcast_mul(scale, branch))


class ResNet(gluon.HybridBlock):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        widths = spec.options["widths"]
        # names, not a list of blocks: Gluon registers children by attribute only
        self.block_names = [name for name, *_ in spec.options["blocks"]]
        with self.name_scope():
            self.stem = gluon.nn.Conv2D(widths[0], 3, padding=1, in_channels=spec.sample_shape[0],
                                        activation="relu")
            for name, c_in, c_out, stride in spec.options["blocks"]:
                setattr(self, name, Block(c_in, c_out, stride))  # the spec's block names
            self.fc = gluon.nn.Dense(spec.num_classes, in_units=widths[-1])

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803 - Gluon's signature
        x = self.stem(x)
        for name in self.block_names:
            x = getattr(self, name)(x)
        return self.fc(F.mean(x, axis=(2, 3)))  # global average pooling


def build(spec: ModelSpec) -> tuple[Any, dict[str, Any]]:
    net = ResNet(spec)
    layers: dict[str, Any] = {"stem": net.stem, "fc": net.fc}
    for name, *_ in spec.options["blocks"]:
        block = getattr(net, name)
        layers[name] = block  # owns "{name}.skip"
        layers[f"{name}.conv1"] = block.conv1
        layers[f"{name}.conv2"] = block.conv2
        if block.shortcut is not None:
            layers[f"{name}.shortcut"] = block.shortcut
    return net, layers
