"""Groups of figures drawn side by side, each in a forked worker process, as many at once
as this process may use cores; the files come back in the groups' order.

Drawing and saving the figures is most of a report's work (docs/measurements.md, "Analysis
in rooms": 10 of the 13 CPU seconds of a `quick` report), and the groups share
nothing but the runs, which a forked worker reads in the parent's memory as they are:
nothing is pickled but a group's index and the paths it wrote. What several groups read
(a run's tables: `Run.once`) is worked out in the parent before the fork (`figures.py`).

Forked only where that is safe and pays: not once torch is imported in this process (its
thread pools do not survive a fork: a script that trains and then draws, pytest's process;
`hetbench run`, `report`, `figures` and `paper` import no torch), not with one core, nor
for one group.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from pathlib import Path

# (what it draws, for a command's progress; drawing it: the files written)
Group = tuple[str, Callable[[], list[Path]]]
# told of each group as it is done ("3 of 12 done: phases")
Progress = Callable[[str], None]

_GROUPS: list[Group] = []  # the groups a forked worker draws, by index (the fork copies it)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as `taskset` or a cgroup set it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


def forks_safely() -> bool:
    return "torch" not in sys.modules and "fork" in multiprocessing.get_all_start_methods()


def draw(groups: Sequence[Group], progress: Progress | None = None,
         processes: int | None = None, longest_first: Sequence[str] = ()) -> list[Path]:
    """Every group drawn, at most `processes` at once (None: as many as usable cores); the
    files each wrote, in the groups' order. The groups named in `longest_first` start
    first, in that order (the longest first keeps the processes busy to the end). An error
    in a group (a full disk) is raised here, as the group raised it, once the others have
    stopped."""
    workers = min(processes or usable_cores(), len(groups))
    if workers < 2 or not forks_safely():
        return _serially(groups, progress)
    global _GROUPS
    _GROUPS = list(groups)
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                 initializer=_as_a_drawing_process) as pool:
            names = [what for what, _ in groups]
            starts = sorted(range(len(groups)), key=lambda i: (
                longest_first.index(names[i]) if names[i] in longest_first
                else len(longest_first), i))
            submitted = {index: pool.submit(_draw, index) for index in starts}
            futures = [submitted[index] for index in range(len(groups))]
            pending, finished = set(futures), 0
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for future in sorted(done, key=futures.index):
                        if (error := future.exception()) is not None:
                            raise error
                        finished += 1
                        _said(progress, finished, groups, futures.index(future))
            except BaseException:  # a group's error, or Ctrl-C: start no other group
                for future in pending:
                    future.cancel()
                raise
            return [path for future in futures for path in future.result()]
    finally:
        _GROUPS = []


def _as_a_drawing_process() -> None:
    """The signals a forked drawing process takes: Ctrl-C is the parent's to handle (it
    stops the drawing once the groups being drawn end), a SIGTERM or SIGHUP ends it at once
    (not the parent's handlers, which would close runs from a copy of its memory)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def _draw(index: int) -> list[Path]:
    return _GROUPS[index][1]()


def _serially(groups: Sequence[Group], progress: Progress | None) -> list[Path]:
    paths: list[Path] = []
    for index, (_, drawing) in enumerate(groups):
        paths += drawing()
        _said(progress, index + 1, groups, index)
    return paths


def _said(progress: Progress | None, count: int, groups: Sequence[Group], index: int
          ) -> None:
    if progress is not None:
        progress(f"{count} of {len(groups)} done: {groups[index][0]}")
