from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.torch_layers import Layer, flatten, relu_pool
from hetbench.workloads.vgg import POOL


class VGG(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.layers: list[str] = []
        c_in, index = spec.sample_shape[0], 0
        for item in spec.options["convs"]:
            if item == POOL:
                self.layers.append("pool")
                continue
            index += 1
            setattr(self, f"conv{index}", nn.Conv2d(c_in, item, 3, padding=1))
            self.layers.append(f"conv{index}")
            c_in = item
        fan_in = 1
        for d in spec.options["features"]:
            fan_in *= d
        units = (*spec.options["fc"], spec.num_classes)
        self.fc_names = [f"fc{i + 1}" for i in range(len(units))]
        for name, out in zip(self.fc_names, units, strict=True):
            setattr(self, name, nn.Linear(fan_in, out))
            fan_in = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.layers:
            x = F.max_pool2d(x, 2) if name == "pool" else F.relu(getattr(self, name)(x))
        x = x.flatten(1)
        for name in self.fc_names[:-1]:
            x = F.relu(getattr(self, name)(x))
        return getattr(self, self.fc_names[-1])(x)


def build(spec: ModelSpec) -> nn.Module:
    return VGG(spec)


def layers(model: VGG) -> list[nn.Module]:
    """Each convolution with its ReLU (and the pooling after it), then each fully connected
    layer (the first flattens its input)."""
    out: list[nn.Module] = []
    for name, following in zip(model.layers, [*model.layers[1:], None], strict=True):
        if name != "pool":
            out.append(Layer(getattr(model, name),
                             after=relu_pool if following == "pool" else F.relu))
    last = len(model.fc_names) - 1
    for i, name in enumerate(model.fc_names):
        out.append(Layer(getattr(model, name), flatten if i == 0 else None,
                         F.relu if i < last else None))
    return out
