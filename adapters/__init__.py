"""Framework adapters behind one Protocol (adapters.base.Adapter), looked up by name.

The registry maps a name to "module:attr" and imports on lookup, so listing frameworks or
validating a suite imports no framework.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from harness.errors import UsageError

if TYPE_CHECKING:
    from adapters.base import Adapter

FRAMEWORKS: dict[str, str] = {
    "pytorch": "adapters.pytorch:TorchAdapter",
}


def load_adapter(name: str) -> type[Adapter]:
    if name not in FRAMEWORKS:
        raise UsageError("framework", f"unknown {name!r} (allowed: {', '.join(FRAMEWORKS)})")
    module, attr = FRAMEWORKS[name].split(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
