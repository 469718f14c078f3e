"""TensorFlow for the workloads' builders and the adapter: the import (after torch, quiet)
and how a spec parameter is held in TensorFlow (NHWC activations, HWIO filters, (out, in)
dense kernels multiplied with transpose_b; adapters/tensorflow.py explains why)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np
import torch  # before TensorFlow: Keras documents a segfault in the other order

from hetbench.workloads.models import ModelSpec

# TensorFlow's C++ INFO lines (CPU feature notes) would open every worker log; warnings stay
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# `import tensorflow` ends by importing Keras 3 (which imports scikit-learn): 3 of its 8 s on
# two cores (docs/frameworks.md). It skips that where TF_USE_LEGACY_KERAS names tf_keras and
# tf_keras is not installed. hetbench builds its models from tf ops and never uses tf.keras
# (which would then fail), so it says so, unless the user chose, or tf_keras is there.
if importlib.util.find_spec("tf_keras") is None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402


@dataclass(frozen=True)
class Layout:
    """How one spec parameter is held in TensorFlow: the spec tensor viewed as `spec_view`
    and permuted by `perm` is the TF variable viewed as `tf_view`, reshaped to `tf_shape`."""

    name: str
    offset: int
    size: int
    spec_view: tuple[int, ...]
    perm: tuple[int, ...]
    tf_view: tuple[int, ...]
    tf_shape: tuple[int, ...]

    @property
    def inverse(self) -> tuple[int, ...]:
        return tuple(int(i) for i in np.argsort(self.perm))

    @property
    def is_identity(self) -> bool:
        return self.perm == tuple(range(len(self.perm)))

    def spec_to_tf(self, spec_tensor: torch.Tensor) -> torch.Tensor:
        return spec_tensor.view(self.spec_view).permute(self.perm)

    def tf_to_spec(self, tf_tensor: torch.Tensor) -> torch.Tensor:
        return tf_tensor.reshape(self.tf_view).permute(self.inverse)


def flatten_layout(spec: ModelSpec, name: str, channels: int, height: int, width: int
                   ) -> dict[str, Layout]:
    """The dense layer right after a conv stack sees NHWC features in H, W, C order: its
    kernel columns are permuted from the spec's C, H, W order (the same features)."""
    p = next(p for p in spec.params if p.name == name)
    offset = sum(q.size for q in spec.params[: spec.params.index(p)])
    units = p.shape[0]
    return {name: Layout(name, offset, p.size, (units, channels, height, width), (0, 2, 3, 1),
                         (units, height, width, channels), (units, height * width * channels))}


def layouts(spec: ModelSpec, overrides: dict[str, Layout] | None = None) -> list[Layout]:
    """TF layout of every spec parameter, in spec order: conv OIHW -> HWIO; dense and LSTM
    kernels stay (out, in) and are multiplied with transpose_b; `overrides` (from the
    workload's builder) where a layer sees its inputs in another order."""
    out, offset = [], 0
    for p in spec.params:
        if overrides and p.name in overrides:
            layout = overrides[p.name]
        elif len(p.shape) == 4:  # conv OIHW -> HWIO
            o, i, kh, kw = p.shape
            layout = Layout(p.name, offset, p.size, p.shape, (2, 3, 1, 0), (kh, kw, i, o),
                            (kh, kw, i, o))
        else:
            identity = tuple(range(len(p.shape)))
            layout = Layout(p.name, offset, p.size, p.shape, identity, p.shape, p.shape)
        out.append(layout)
        offset += p.size
    return out


def dense(v: dict[str, tf.Variable], name: str, x: tf.Tensor) -> tf.Tensor:
    """x @ weight.T + bias with the spec's (out, in) kernel."""
    return tf.matmul(x, v[f"{name}.weight"], transpose_b=True) + v[f"{name}.bias"]
