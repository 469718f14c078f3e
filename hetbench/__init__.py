"""hetbench, under one import name.

The code lives in the repository's top-level folders (harness/, adapters/, workloads/,
analysis/), installed as `hetbench.harness`, `hetbench.adapters`, `hetbench.workloads` and
`hetbench.analysis` (pyproject's package-dir), so that installing hetbench claims no generic
top-level name a user's project may have. In a checkout, hetbench/<room> is a link to the
room's folder: the checkout imports as the installed package does, with no install (a
`hetbench ci` base worktree runs its own code that way).
"""

from __future__ import annotations

from hetbench.harness import __version__

__all__ = ["__version__"]
