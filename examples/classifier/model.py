"""The classifier example's job: a small ResNet in plain torch, with BatchNorm and dropout,
on the JPEG folder make_images.py writes (read by hetbench.open_data: decoded with Pillow in
the DataLoader's processes)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hetbench

DATA = Path(__file__).resolve().parent / "data"


class Block(nn.Module):
    """A basic residual block: two 3x3 convolutions, BatchNorm after each."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                          nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, classes: int, widths: tuple[int, ...] = (16, 32, 64),
                 dropout: float = 0.2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, inputs = [], widths[0]
        for i, width in enumerate(widths):
            blocks.append(Block(inputs, width, 1 if i == 0 else 2))
            inputs = width
        self.blocks = nn.Sequential(*blocks)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(inputs, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(x)).mean((2, 3))
        return self.head(self.dropout(features))


class Head(nn.Module):
    """The classifier's last layer for a pipeline: pooling, dropout and the linear head,
    the model's own modules."""

    def __init__(self, model: SmallResNet) -> None:
        super().__init__()
        self.dropout, self.head = model.dropout, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(x.mean((2, 3))))


def layers(model: nn.Module) -> list[nn.Module]:
    """The model cut for pipelines (Job.layers): the stem, each residual block, the head."""
    assert isinstance(model, SmallResNet)
    return [model.stem, *model.blocks, Head(model)]


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    return float((outputs.argmax(1) == targets).sum()), float(len(targets))


def make() -> hetbench.Job:
    train = hetbench.open_data(DATA / "train")
    heldout = hetbench.open_data(DATA / "heldout")
    return hetbench.Job(model=SmallResNet(train.num_classes or 10),
                        loss=nn.CrossEntropyLoss(), reduction="mean", train=train,
                        heldout=heldout, metric=accuracy, layers=layers)


class Remote(torch.utils.data.Dataset):
    """The same images as read from slower storage (a network filesystem, an object store):
    each read waits `latency_ms` before the decode. Waiting, not computing: where decoding
    competes with training for the same cores, more DataLoader processes buy little, where
    reads wait on storage they overlap the waits (starved.toml measures both)."""

    def __init__(self, data: Any, latency_ms: float) -> None:
        self.data, self.latency_s = data, latency_ms / 1000

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.latency_s)
        return self.data[index]


def make_remote() -> hetbench.Job:
    """make()'s job, its training images read with 1 ms of storage latency each."""
    job = make()
    return dataclasses.replace(job, train=Remote(job.train, latency_ms=1.0))
