"""A PyTorch model as a sequence of layers, for cutting it into pipeline stages (HetPipe,
harness/loop/stage.py): each builder's `layers(model)` returns `Layer`s whose
composition in order is the model's forward, sharing the model's parameters.

A layer is one parameterised module between an optional input transform (flatten, global
average pooling) and an optional output transform (activation, pooling), so a cut between
two layers sends one activation tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Transform = Callable[[torch.Tensor], torch.Tensor]


class Layer(nn.Module):
    def __init__(self, module: nn.Module, before: Transform | None = None,
                 after: Transform | None = None) -> None:
        super().__init__()
        self.module = module
        self.before, self.after = before, after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.before is not None:
            x = self.before(x)
        x = self.module(x)
        return x if self.after is None else self.after(x)


def flatten(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1)


def relu_pool(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool2d(F.relu(x), 2)


def global_average(x: torch.Tensor) -> torch.Tensor:
    return x.mean((2, 3))


def parameter_range(spec: Any, model: Any, stage_layers: list[Any], torch_names: dict[str, str]
                    ) -> tuple[int, int]:
    """[lo, hi) of the stage's parameters in the flat spec-order buffer (a stage's layers
    are consecutive, so are their parameters)."""
    named = dict(model.named_parameters())
    mine = {id(p) for layer in stage_layers for p in layer.parameters()}
    spans, offset = [], 0
    for p in spec.params:
        if id(named[torch_names.get(p.name, p.name)]) in mine:
            spans.append((offset, offset + p.size))
        offset += p.size
    if not spans:
        return 0, 0
    if any(a[1] != b[0] for a, b in zip(spans, spans[1:], strict=False)):
        raise RuntimeError(f"{spec.workload}: a stage's parameters are not consecutive in "
                           "the spec's order")
    return spans[0][0], spans[-1][1]
