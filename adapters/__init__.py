"""Framework adapters behind one Protocol (adapters.base.Adapter), looked up by name.

The registry maps a name to "module:attr" and imports on lookup, so listing frameworks or
validating a suite imports no framework.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from harness.spec.errors import UsageError

if TYPE_CHECKING:
    from adapters.base import Adapter

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


def load_adapter(name: str) -> type[Adapter]:
    if name not in FRAMEWORKS:
        raise UsageError("framework", f"unknown {name!r} (allowed: {', '.join(FRAMEWORKS)})")
    module, attr = FRAMEWORKS[name].split(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
