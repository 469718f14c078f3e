"""pytest-benchmark benchmarks of hetbench's hot paths (see README.md here).

Files are named bench_*.py so that no test run collects them: the repository's default
`pytest` looks only in tests/, and this hook makes `pytest benchmarks/` collect bench_*.py
(the other scripts in this folder are run by hand, not collected).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_collect_file(file_path: Path, parent: Any) -> Any:
    # A file named on the command line is collected by pytest itself: do not add it twice.
    if parent.session.isinitpath(file_path):
        return None
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture(scope="session")
def gloo_world_of_one() -> Iterator[None]:
    """A gloo process group of world size 1 in this process (as benchmarks/overhead.py)."""
    from hetbench.harness.exchange import comm
    from hetbench.harness.run.launcher import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                      GLOO_SOCKET_IFNAME="lo")
    comm.init(0, 1, "gloo", 60)
    yield
    comm.shutdown()
