"""hetbench, under one import name.

The code lives in the repository's top-level folders (harness/, adapters/, workloads/,
analysis/), installed as `hetbench.harness`, `hetbench.adapters`, `hetbench.workloads` and
`hetbench.analysis` (pyproject's package-dir), so that installing hetbench claims no generic
top-level name a user's project may have. In a checkout, hetbench/<room> is a link to the
room's folder: the checkout imports as the installed package does, with no install (a
`hetbench ci` base worktree runs its own code that way).

The public API: `hetbench.Job`, what a factory named by a suite's `workload =
"package.module:factory"` returns (hetbench.workloads.job); `hetbench.open_data`, a
local folder or file of data as a Dataset for it (hetbench.workloads.folders); and
`hetbench.join`, a rank of a user's own torchrun loop joining its job, per-device slices
and records (hetbench.harness.userloop.joining).
"""

from __future__ import annotations

from typing import Any

from hetbench.harness import __version__
from hetbench.harness.spec.errors import UsageError  # what the public API raises

__all__ = ["Job", "UsageError", "__version__", "join", "open_data"]


def __getattr__(name: str) -> Any:
    # on first use: `import hetbench` (every command's first import) stays free of numpy,
    # and open_data's of torch
    if name == "Job":
        from hetbench.workloads.job import Job

        return Job
    if name == "open_data":
        from hetbench.workloads.folders import open_data

        return open_data
    if name == "join":
        from hetbench.harness.userloop.joining import join

        return join
    raise AttributeError(f"module 'hetbench' has no attribute {name!r}")
