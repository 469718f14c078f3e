"""The frameworks by name: each one's adapter (loaded by name, so listing frameworks or
checking a suite imports none) and the package it needs."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Framework:
    """A framework as the registry knows it, before any import."""

    adapter: str  # "module:attr" of its adapter class (adapters/)
    module: str  # the package it imports
    extra: str | None  # the extra that installs it; None: a core dependency
    # Its models are torch.nn.Modules cut into layers (workloads/torch_layers.py), which
    # pipeline stages (torch.distributed.pipelining) and a layer computed on a parameter
    # server (placement fc-on-server) need.
    torch_layers: bool = False


FRAMEWORKS: dict[str, Framework] = {
    "pytorch": Framework("hetbench.adapters.pytorch:TorchAdapter", "torch", None,
                         torch_layers=True),
    "tensorflow": Framework("hetbench.adapters.tensorflow:TensorFlowAdapter", "tensorflow",
                            "tensorflow"),
    "mxnet": Framework("hetbench.adapters.mxnet:MXNetAdapter", "mxnet", "mxnet"),
}
# framework -> (the module it imports, the extra that installs it)
REQUIREMENTS: dict[str, tuple[str, str | None]] = {
    name: (f.module, f.extra) for name, f in FRAMEWORKS.items()}


def with_torch_layers() -> list[str]:
    """The frameworks whose models can be cut into torch layers."""
    return [name for name, f in FRAMEWORKS.items() if f.torch_layers]


def install_hint(name: str) -> str:
    extra = REQUIREMENTS[name][1]
    return f"pip install 'hetbench[{extra}]'" if extra else "pip install hetbench"


def missing_framework(name: str) -> str | None:
    """Why framework `name` cannot run in this environment, or None. Uses find_spec, so
    the check imports no framework (the CLI and the launcher must not)."""
    module = REQUIREMENTS[name][0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{name} is not installed ({install_hint(name)})"
