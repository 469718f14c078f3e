"""Framework-neutral model specs: the parameters by name, shape and initial value.

Layout conventions every framework builder follows (and converts from where its framework
differs): dense weights are (out, in); conv weights (out, in, kh, kw) over NCHW inputs,
flattened in C, H, W order; LSTM gates in the order input, forget, cell, output, with
weight_ih (4H, E), weight_hh (4H, H) and separate bias_ih and bias_hh.

Losses are sums over samples, so gradients add up across workers. Two loss kinds exist
(`ModelSpec.loss`), each implemented once per adapter:
- "classify": logits (N, C) against int64 labels (N,); a sample's loss is its cross-entropy.
- "tokens": logits (N, L, V) against int64 targets (N, L); a target of IGNORE does not
  count, and a sample's loss is the mean over its counted tokens (so it depends on that
  sample alone, and slices still add up exactly).
"""

from __future__ import annotations

import importlib
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SIZES = ("tiny", "small", "base")
DEFAULT_SIZE = "small"
LOSSES = ("classify", "tokens")
IGNORE = -1  # a token target that does not count (padding, unmasked positions)


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    init_bound: float  # offset + uniform(-bound, bound); bound 0 gives the offset
    init_offset: float = 0.0  # 1 for LayerNorm gains

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelSpec:
    workload: str
    sample_shape: tuple[int, ...]
    num_classes: int
    params: tuple[ParamSpec, ...]
    options: dict[str, Any] = field(default_factory=dict)
    loss: str = "classify"
    size: str = DEFAULT_SIZE
    input_dtype: str = "float32"  # "int64" for token inputs
    target_shape: tuple[int, ...] = ()  # per sample: () for a label, (L,) for tokens

    @property
    def num_elements(self) -> int:
        return sum(p.size for p in self.params)

    def initial_parameters(self, seed: int) -> dict[str, np.ndarray]:
        """float32 values generated from (seed, parameter name) alone, the same everywhere."""
        values = {}
        for p in self.params:
            rng = np.random.default_rng([seed, zlib.crc32(p.name.encode())])
            values[p.name] = (p.init_offset + rng.uniform(-p.init_bound, p.init_bound, p.shape)
                              ).astype(np.float32)
        return values


SpecFunction = Callable[[str, tuple[int, ...], int], ModelSpec]


@dataclass(frozen=True)
class Workload:
    """A workload defined once: which data it trains on, its loss and held-out metric, and
    its model spec at each size. Each framework's builder lives beside it, in
    workloads/<name>/<framework>.py."""

    name: str
    datasets: tuple[str, ...]  # the first is the default
    loss: str
    spec: SpecFunction  # (size, sample_shape, num_classes) -> ModelSpec
    description: str
    sizes: tuple[str, ...] = SIZES
    synthetic_shape: tuple[int, ...] = (1, 28, 28)  # images of the 'synthetic' data set
    # Per-batch input transform in the load phase (BERT's masking): (inputs, targets, seed,
    # step, slice start, global batch, num_classes) -> (inputs, targets); it must depend on
    # the sample's place in the global batch, never on the slice, or partitions would
    # change the mathematics. prepare_heldout: the same, once, for the held-out split.
    prepare: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
    prepare_heldout: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
    # size -> how many layers its PyTorch builder's `layers(model)` cuts the model into
    # (pipeline stages hold consecutive layers); None: the workload cannot be pipelined
    layers: Callable[[str], int] | None = None
    # size -> how many of those layers, at the end, are fully connected: what the
    # fc-on-server placement computes on a parameter server; None: no such tail to place
    fc_layers: Callable[[str], int] | None = None

    @property
    def default_dataset(self) -> str:
        return self.datasets[0]

    @property
    def metric(self) -> str:
        """The held-out metric reported besides the loss."""
        return "token_accuracy" if self.loss == "tokens" else "accuracy"


def dense(name: str, fan_in: int, fan_out: int) -> list[ParamSpec]:
    bound = 1.0 / math.sqrt(fan_in)
    return [ParamSpec(f"{name}.weight", (fan_out, fan_in), bound),
            ParamSpec(f"{name}.bias", (fan_out,), bound)]


def conv(name: str, c_in: int, c_out: int, kernel: int = 3, bias: bool = True,
         gain: float = 1.0) -> list[ParamSpec]:
    """A conv layer's weight (out, in, k, k), uniform with bound gain / sqrt(fan_in)."""
    fan_in = c_in * kernel * kernel
    bound = gain / math.sqrt(fan_in)
    params = [ParamSpec(f"{name}.weight", (c_out, c_in, kernel, kernel), bound)]
    if bias:
        params.append(ParamSpec(f"{name}.bias", (c_out,), 1.0 / math.sqrt(fan_in)))
    return params


def layer_norm(name: str, width: int) -> list[ParamSpec]:
    return [ParamSpec(f"{name}.weight", (width,), 0.0, 1.0),
            ParamSpec(f"{name}.bias", (width,), 0.0)]


def check_size(workload: str, size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"{workload}: unknown size {size!r} (allowed: {', '.join(SIZES)})")


def builder(workload: str, framework: str) -> Any:
    """The module that builds `workload` in `framework` (workloads/<name>/<framework>.py)."""
    return importlib.import_module(f"hetbench.workloads.{workload}.{framework}")
