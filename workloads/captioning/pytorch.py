from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetbench.workloads.models import ModelSpec

PARAMETER_NAMES = {
    "lstm.weight_ih": "lstm.weight_ih_l0",
    "lstm.weight_hh": "lstm.weight_hh_l0",
    "lstm.bias_ih": "lstm.bias_ih_l0",
    "lstm.bias_hh": "lstm.bias_hh_l0",
}


class Captioner(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        o = spec.options
        (c1, c2, c3), e, h = o["convs"], o["embed"], o["hidden"]
        self.pixels, self.image_shape = o["pixels"], o["image_shape"]
        self.conv1 = nn.Conv2d(self.image_shape[0], c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.conv3 = nn.Conv2d(c2, c3, 3, padding=1)
        self.init_h, self.init_c = nn.Linear(c3, h), nn.Linear(c3, h)
        self.embed = nn.Embedding(spec.num_classes, e)
        self.lstm = nn.LSTM(e, h, batch_first=True)
        self.out = nn.Linear(h, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = x[:, : self.pixels].reshape(-1, *self.image_shape)
        words = x[:, self.pixels:].long()
        f = F.max_pool2d(F.relu(self.conv1(image)), 2)
        f = F.max_pool2d(F.relu(self.conv2(f)), 2)
        f = F.relu(self.conv3(f)).mean((2, 3))
        state = (torch.tanh(self.init_h(f))[None], torch.tanh(self.init_c(f))[None])
        out, _ = self.lstm(self.embed(words), state)
        return self.out(out)


def build(spec: ModelSpec) -> nn.Module:
    return Captioner(spec)
