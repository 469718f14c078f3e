"""Errors meant for people: one line, naming the field or path and what is allowed."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def listed(names: list[str], most: int = 4) -> str:
    """Names in a message: the first `most`, then how many more (a suite of 10,000 runs
    is one short line, not 69 KB)."""
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more} more" if more > 0 else "")


class UsageError(Exception):
    """Bad input (suite file, arguments, result folder). The CLI prints it and exits 2."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class DeviceUnavailable(UsageError):
    """A worker names a device this machine does not have (skippable with --skip-unavailable)."""


class NotClosed(Exception):
    """A run directory could not be written as its run closed (made read-only or immutable,
    its disk gone): the run stays `running`, its flushed records in parts/, and
    `hetbench recover` closes it once the folder is writable. The CLI exits 1."""

    def __init__(self, run_dir: Path, cause: OSError) -> None:
        self.run_dir = run_dir
        super().__init__(f"{run_dir}: the run could not be closed (writing manifest.json: "
                         f"{cause.strerror or cause}); its workers are stopped and its "
                         "flushed records stay in parts/: once the folder is writable, close "
                         f"it with `hetbench recover {run_dir}`")


class NodeLost(Exception):
    """Across hosts, node 0 (whose launcher serves the launch's store) stopped answering:
    this host's part of the run is closed and the suite cannot go on. The CLI exits 1."""
