from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.torch_layers import Layer, flatten


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        shapes = {p.name: p.shape for p in spec.params}
        self.fc1 = nn.Linear(*reversed(shapes["fc1.weight"]))
        self.fc2 = nn.Linear(*reversed(shapes["fc2.weight"]))
        self.fc3 = nn.Linear(*reversed(shapes["fc3.weight"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def build(spec: ModelSpec) -> nn.Module:
    return MLP(spec)


def layers(model: MLP) -> list[nn.Module]:
    """fc1, fc2, fc3 (harness/loop/stage.py cuts between them)."""
    return [Layer(model.fc1, flatten, F.relu), Layer(model.fc2, after=F.relu), Layer(model.fc3)]
