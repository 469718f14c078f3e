"""Framework-neutral model specs: the parameters by name, shape and initial value.

Layout conventions every adapter follows (and converts from where its framework differs):
dense weights are (out, in); conv weights (out, in, kh, kw) over NCHW inputs, flattened in
C, H, W order; LSTM gates in the order input, forget, cell, output, with weight_ih (4H, E),
weight_hh (4H, H) and separate bias_ih and bias_hh. Losses are sums over samples (an LSTM
sample's loss is the mean over its tokens), so gradients add up across workers.
"""

from __future__ import annotations

import importlib
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MLP_HIDDEN = 256
CNN_CHANNELS = (16, 32)
LSTM_EMBED = 32
LSTM_HIDDEN = 128


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    init_bound: float  # uniform(-bound, bound)

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

    @property
    def num_elements(self) -> int:
        return sum(p.size for p in self.params)

    def initial_parameters(self, seed: int) -> dict[str, np.ndarray]:
        """float32 values generated from (seed, parameter name) alone, the same everywhere."""
        values = {}
        for p in self.params:
            rng = np.random.default_rng([seed, zlib.crc32(p.name.encode())])
            values[p.name] = rng.uniform(-p.init_bound, p.init_bound, p.shape).astype(np.float32)
        return values


def _dense(name: str, fan_in: int, fan_out: int) -> list[ParamSpec]:
    bound = 1.0 / math.sqrt(fan_in)
    return [ParamSpec(f"{name}.weight", (fan_out, fan_in), bound),
            ParamSpec(f"{name}.bias", (fan_out,), bound)]


def mlp_spec(sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    n_in = math.prod(sample_shape)
    params = (_dense("fc1", n_in, MLP_HIDDEN) + _dense("fc2", MLP_HIDDEN, MLP_HIDDEN)
              + _dense("fc3", MLP_HIDDEN, num_classes))
    return ModelSpec("mlp", sample_shape, num_classes, tuple(params), {"hidden": MLP_HIDDEN})


def cnn_spec(sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    """conv3x3(pad 1)-relu-maxpool2, twice, then one dense layer. No BatchNorm, no dropout."""
    channels, height, width = sample_shape
    c1, c2 = CNN_CHANNELS
    params = []
    for name, c_in, c_out in (("conv1", channels, c1), ("conv2", c1, c2)):
        bound = 1.0 / math.sqrt(c_in * 9)
        params += [ParamSpec(f"{name}.weight", (c_out, c_in, 3, 3), bound),
                   ParamSpec(f"{name}.bias", (c_out,), bound)]
    params += _dense("fc", c2 * (height // 4) * (width // 4), num_classes)
    return ModelSpec("cnn", sample_shape, num_classes, tuple(params), {"channels": CNN_CHANNELS})


def lstm_spec(sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    """Character LM: embedding, one LSTM layer, dense decoder over the vocabulary."""
    vocab, e, h = num_classes, LSTM_EMBED, LSTM_HIDDEN
    bound = 1.0 / math.sqrt(h)
    params = [
        ParamSpec("embed.weight", (vocab, e), 0.1),
        ParamSpec("lstm.weight_ih", (4 * h, e), bound),
        ParamSpec("lstm.weight_hh", (4 * h, h), bound),
        ParamSpec("lstm.bias_ih", (4 * h,), bound),
        ParamSpec("lstm.bias_hh", (4 * h,), bound),
        *_dense("decoder", h, vocab),
    ]
    return ModelSpec("lstm", sample_shape, num_classes, tuple(params),
                     {"embed": e, "hidden": h, "seq_len": sample_shape[0]})


def build_spec(workload: str, sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    from workloads import WORKLOADS

    module_name, attr = WORKLOADS[workload].split(":")
    return getattr(importlib.import_module(module_name), attr)(sample_shape, num_classes)  # type: ignore[no-any-return]
