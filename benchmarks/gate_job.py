"""A user's job for calibrating the regression gate (benchmarks/calibrate_gate.py `pool
--job`): a small CNN on generated 16x16 images, and the same job with more compute, real
work and not an emulated stretch: the forward runs its convolutions again over an extra share
of the slice, in the same calls (and so does the backward), so a step's CPU time grows with
that share.

    make          the job
    make_slower_10, make_slower_30   its forward and backward on 30% and 50% more samples:
                                     1.1x and 1.3x of their CPU time (SLOWER_10, SLOWER_30)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hetbench

SAMPLES, CLASSES, SIDE = 1024, 10, 16


class Net(nn.Module):
    def __init__(self, extra: float = 0.0) -> None:
        super().__init__()
        self.extra = extra
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = len(x)
        if self.extra and self.training:
            # `extra` of the slice again in the same calls, so the convolutions' work (and
            # their backward's) grows by that share and their per-call cost does not; only
            # the slice's own rows go on, so the loss and the gradient are unchanged
            x = torch.cat([x, x[:max(1, round(self.extra * n))]])
        return self.head(self.body(x)[:n])


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    return float((outputs.argmax(-1) == targets).sum()), float(targets.numel())


def job(extra: float = 0.0) -> hetbench.Job:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(SAMPLES, 1, SIDE, SIDE, generator=g)
    labels = images.mean(dim=(1, 2, 3)).mul(40).long().clamp(-5, 4) + 5
    data = TensorDataset(images, labels)
    return hetbench.Job(model=Net(extra), loss=nn.CrossEntropyLoss(), reduction="mean",
                        train=data, heldout=data, metric=accuracy)


def make() -> hetbench.Job:
    return job()


# the shares that make a forward and backward of a 32-sample slice 1.11x and 1.33x the
# job's CPU time on this machine class (oneDNN's convolutions grow in steps of the batch:
# 10% and 20% more samples both made it 1.07x; docs/measurements.md)
SLOWER_10, SLOWER_30 = 0.3, 0.5


def make_slower_10() -> hetbench.Job:
    return job(SLOWER_10)


def make_slower_30() -> hetbench.Job:
    return job(SLOWER_30)
