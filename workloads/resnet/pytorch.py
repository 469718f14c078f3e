from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.torch_layers import Layer, global_average


class Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Parameter(torch.zeros(1))
        self.shortcut = (nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
                         if stride != 1 or c_in != c_out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.conv2(F.relu(self.conv1(x)))
        identity = x if self.shortcut is None else self.shortcut(x)
        return F.relu(identity + self.skip * branch)


class ResNet(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        widths = spec.options["widths"]
        self.stem = nn.Conv2d(spec.sample_shape[0], widths[0], 3, padding=1)
        self.block_names = [name for name, *_ in spec.options["blocks"]]
        for name, c_in, c_out, stride in spec.options["blocks"]:
            setattr(self, name, Block(c_in, c_out, stride))  # parameter names as the spec's
        self.fc = nn.Linear(widths[-1], spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        for name in self.block_names:
            x = getattr(self, name)(x)
        return self.fc(x.mean((2, 3)))


def build(spec: ModelSpec) -> nn.Module:
    return ResNet(spec)


def layers(model: ResNet) -> list[nn.Module]:
    """The stem, each block, then global pooling and fc."""
    return [Layer(model.stem, after=F.relu),
            *(getattr(model, name) for name in model.block_names),
            Layer(model.fc, global_average)]
