"""Per-layer profile of a PyTorch model on this worker's device (HetPipe's partitioner
input, harness/partition/stages.py): each layer's forward + backward time on one micro-batch
(and its forward's alone: `hetbench advise` splits a stage's ops by it), the bytes of the
activation it sends onward, and its parameter bytes.

Each layer is timed on its own input (the previous layer's output, detached), forward then
backward with an upstream gradient of ones; the median over `passes` after one warm-up pass.
The worker's emulated slowdown multiplies the times, as it stretches every compute phase.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class LayerProfile:
    time_ns: list[float]  # forward + backward per layer, one micro-batch
    activation_bytes: list[float]  # each layer's output, one micro-batch
    parameter_bytes: list[float]
    forward_ns: list[float] = field(default_factory=list)  # of time_ns, the forward's


def profile_layers(layers: Sequence[nn.Module], sample: torch.Tensor, passes: int,
                   slowdown: float = 1.0, synchronize: bool = False) -> LayerProfile:
    """Profile `layers` (composed in order) on the micro-batch `sample`. Gradients the
    backward passes leave in the parameters are the caller's to zero."""
    times, forwards, sizes = [], [], []
    x = sample
    for layer in layers:
        durations, forward = [], []
        out = x
        for _ in range(passes + 1):  # the first pass warms caches and allocators
            inp = x.detach().requires_grad_(x.is_floating_point())
            begin = time.perf_counter_ns()
            out = layer(inp)
            if synchronize:
                torch.cuda.synchronize(out.device)
            forward.append(time.perf_counter_ns() - begin)
            out.backward(torch.ones_like(out))
            if synchronize:
                torch.cuda.synchronize(out.device)
            durations.append(time.perf_counter_ns() - begin)
        times.append(statistics.median(durations[1:]) * slowdown)
        forwards.append(statistics.median(forward[1:]) * slowdown)
        sizes.append(float(out.numel() * out.element_size()))
        x = out.detach()
    params = [float(sum(p.numel() * p.element_size() for p in layer.parameters()))
              for layer in layers]
    return LayerProfile(times, sizes, params, forwards)
