"""The frameworks by name: each one's adapter (loaded by name, so listing frameworks or
checking a suite imports none) and the package it needs."""

from __future__ import annotations

import importlib.util

FRAMEWORKS: dict[str, str] = {
    "pytorch": "adapters.pytorch:TorchAdapter",
    "tensorflow": "adapters.tensorflow:TensorFlowAdapter",
    "mxnet": "adapters.mxnet:MXNetAdapter",
}


# framework -> (the module it imports, the extra that installs it; None: a core dependency)
REQUIREMENTS: dict[str, tuple[str, str | None]] = {
    "pytorch": ("torch", None),
    "tensorflow": ("tensorflow", "tensorflow"),
    "mxnet": ("mxnet", "mxnet"),
}


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
