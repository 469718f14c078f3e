"""MXNet for the workloads' builders and the adapter: its import, made to work with the
numpy hetbench pins (docs/frameworks.md: MXNet 1.9.1 uses np.bool, removed in numpy 1.24)."""

from __future__ import annotations

import warnings

import numpy as np

if "bool" not in vars(np):  # MXNet 1.9.1 uses np.bool, removed in numpy 1.24
    np.bool = bool  # type: ignore[attr-defined]

with warnings.catch_warnings():  # its import warns about numpy and distutils APIs it uses
    warnings.simplefilter("ignore", DeprecationWarning)
    import mxnet as mx
    from mxnet import autograd, gluon

__all__ = ["autograd", "gluon", "mx"]
