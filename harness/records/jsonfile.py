"""JSON files of a run directory read in one way: damage is one line naming the file.

A run directory can be damaged (a crash mid-write, a full disk, a hand edit, a hostile
file): every reader gets a UsageError that names the file and what is wrong with it, never
a decoder's traceback. Deep nesting is refused too: Python's parser recurses, and a
manifest nested 100,000 levels deep raised RecursionError in every reading command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetbench.harness.spec.errors import UsageError


def read(path: Path, what: str) -> Any:
    """The JSON value in `path`; `what` names the file's role in the message
    ("manifest", "worker description")."""
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise UsageError(str(path), f"unreadable {what}: {exc.strerror or exc}") from None
    except RecursionError:
        raise UsageError(str(path), f"unreadable {what}: JSON nested too deep") from None
    except ValueError as exc:  # not JSON, or not text at all (UnicodeDecodeError)
        raise UsageError(str(path), f"unreadable {what}: {exc}") from None
