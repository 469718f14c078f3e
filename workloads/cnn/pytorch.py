from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.torch_layers import Layer, flatten, relu_pool


class CNN(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        shapes = {p.name: p.shape for p in spec.params}
        c1, c_in = shapes["conv1.weight"][:2]
        c2 = shapes["conv2.weight"][0]
        self.conv1 = nn.Conv2d(c_in, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc = nn.Linear(*reversed(shapes["fc.weight"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def build(spec: ModelSpec) -> nn.Module:
    return CNN(spec)


def layers(model: CNN) -> list[nn.Module]:
    """conv1, conv2 (each with its ReLU and pooling), fc."""
    return [Layer(model.conv1, after=relu_pool), Layer(model.conv2, after=relu_pool),
            Layer(model.fc, flatten)]
