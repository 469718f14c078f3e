from __future__ import annotations

import torch
from torch import nn

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.transformer.pytorch import EncoderLayer


class Bert(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        o = spec.options
        self.layers = o["layers"]
        self.embed = nn.Embedding(spec.num_classes + 1, o["d"])
        self.pos = nn.Embedding(spec.sample_shape[0], o["d"])
        for i in range(self.layers):
            setattr(self, f"enc{i}", EncoderLayer(o["d"], o["heads"], o["ff"], o["scale"]))
        self.enc_ln = nn.LayerNorm(o["d"])
        self.out = nn.Linear(o["d"], spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos.weight
        for i in range(self.layers):
            h = getattr(self, f"enc{i}")(h, None)  # no mask: every position sees every other
        return self.out(self.enc_ln(h))


def build(spec: ModelSpec) -> nn.Module:
    return Bert(spec)
