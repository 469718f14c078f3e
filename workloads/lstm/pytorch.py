from __future__ import annotations

import torch
from torch import nn

from hetbench.workloads.models import ModelSpec

# spec name -> torch parameter name, where they differ
PARAMETER_NAMES = {
    "lstm.weight_ih": "lstm.weight_ih_l0",
    "lstm.weight_hh": "lstm.weight_hh_l0",
    "lstm.bias_ih": "lstm.bias_ih_l0",
    "lstm.bias_hh": "lstm.bias_hh_l0",
}


class CharLSTM(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        vocab, embed, hidden = spec.num_classes, spec.options["embed"], spec.options["hidden"]
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x))
        return self.decoder(out)


def build(spec: ModelSpec) -> nn.Module:
    return CharLSTM(spec)
