"""Framework adapters behind one Protocol (hetbench.adapters.base.Adapter), looked up by name.

The registry (harness/spec/frameworks.py) maps a name to "module:attr"; load_adapter imports
on lookup, so listing frameworks or validating a suite imports no framework.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.frameworks import (  # re-exported: the adapters' registry
    FRAMEWORKS,
    REQUIREMENTS,
    install_hint,
    missing_framework,
)

if TYPE_CHECKING:
    from hetbench.adapters.base import Adapter


def load_adapter(name: str) -> type[Adapter]:
    if name not in FRAMEWORKS:
        raise UsageError("framework", f"unknown {name!r} (allowed: {', '.join(FRAMEWORKS)})")
    module, attr = FRAMEWORKS[name].adapter.split(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


__all__ = ["FRAMEWORKS", "REQUIREMENTS", "install_hint", "load_adapter", "missing_framework"]
