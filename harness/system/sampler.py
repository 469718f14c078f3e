"""What the rest of the machine did while a run trained: a sampler thread in the launcher
(off every worker's timed path) reads the host's CPU times about ten times a second and
splits the busy time between the run's own processes (workers, servers) and everything
else, beside the hypervisor's steal time and the CPU clock. Joined to the step records by
time, it lets straggler attribution tell interference by other processes (or a
hypervisor) from a worker's own delays.

The samples share the workers' clock (time.perf_counter_ns: CLOCK_MONOTONIC, one clock per
host), so only local runs have them; torchrun mode has no launcher to sample.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

SYSTEM_FILE = "system.parquet"
INTERVAL_S = 0.1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# the columns of system.parquet: the end of each sampled interval (ns, the workers' clock)
# and the mean number of cores busy over it, by whom; the mean CPU clock
COLUMNS = ("t_ns", "busy_cores", "run_cores", "others_cores", "steal_cores", "cpu_mhz")
JOINED = ("others_cores", "steal_cores", "cpu_mhz")  # what each step is given (join_to_steps)


def _host_cpu_ns() -> tuple[float, float]:
    """(busy, steal) CPU time of the whole host so far, ns (psutil: /proc/stat's first
    line on Linux; steal is 0 where the platform has none)."""
    times = psutil.cpu_times()
    busy = times.user + times.nice + times.system + getattr(times, "irq", 0.0) \
        + getattr(times, "softirq", 0.0)
    return busy * 1e9, getattr(times, "steal", 0.0) * 1e9


def _process_cpu_ns(pid: int) -> tuple[float, float]:
    """User + system CPU time so far of a process and all its threads, and of its children
    that ended and that it reaped (cutime + cstime), ns; (0, 0) once gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = text[text.rfind(")") + 2:].split()
    own = (int(fields[11]) + int(fields[12])) * 1e9 / CLOCK_TICKS
    return own, (int(fields[13]) + int(fields[14])) * 1e9 / CLOCK_TICKS


def with_descendants(pids: list[int]) -> list[int]:
    """The processes and every process below them (a loader's decode pool), from
    /proc/PID/task/TID/children: only the run's own tasks are read (psutil's
    children(recursive=True) reads every process on the host to build the tree, ten times
    a second a load of its own beside the run it measures)."""
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                todo += map(int, Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
            except OSError:
                pass
    return found


def _cpu_mhz() -> float:
    """The mean current clock of the cores (psutil: cpufreq in sysfs, else /proc/cpuinfo;
    NaN where neither shows it)."""
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError):
        return float("nan")
    return float(freq.current) if freq is not None and freq.current > 0 else float("nan")


class Sampler:
    """Samples the host every INTERVAL_S in a daemon thread until stop(); `pids()` names
    the run's processes at each sample (they and their descendants count as the run's;
    they may come and go)."""

    def __init__(self, pids: Callable[[], list[int]], interval_s: float = INTERVAL_S) -> None:
        self._pids, self._interval_s = pids, interval_s
        self._rows: list[tuple[float, ...]] = []
        self._run_ns: dict[int, float] = {}  # the named processes' last CPU time
        self._own_pid = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hetbench-system-sampler",
                                        daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _run_cpu_ns(self) -> float:
        """The run's processes' CPU time so far: each live process's own and that of the
        children it reaped, so that a process ending between two samples (a DataLoader's,
        shut down at a repartition) keeps its last moments in its parent's count instead
        of leaving them to "others"; a process the launcher named that ended keeps its
        last. The sampling process's reaped children are those named, counted each."""
        named = self._pids()
        live = 0.0
        for pid in dict.fromkeys(with_descendants(named)):
            own, reaped = _process_cpu_ns(pid)
            total = own + (0.0 if pid == self._own_pid else reaped)
            if pid in named:
                if total > 0:
                    self._run_ns[pid] = total
            else:
                live += total
        return live + sum(self._run_ns.values())

    def _loop(self) -> None:
        try:
            before = (time.perf_counter_ns(), *_host_cpu_ns(), self._run_cpu_ns())
            while not self._stop.wait(self._interval_s):
                now = (time.perf_counter_ns(), *_host_cpu_ns(), self._run_cpu_ns())
                wall = now[0] - before[0]
                busy, steal, run = ((now[i] - before[i]) / wall for i in (1, 2, 3))
                self._rows.append((now[0], busy, run, max(busy - run, 0.0), steal, _cpu_mhz()))
                before = now
        except OSError:  # no /proc (not Linux): no samples, nothing else lost
            return

    def stop(self) -> np.ndarray:
        """Stop sampling; the samples as a (n, len(COLUMNS)) array."""
        self._stop.set()
        self._thread.join(timeout=5 * self._interval_s + 1)
        return np.array(self._rows, dtype=float).reshape(-1, len(COLUMNS))


def write(run_dir: Path, samples: np.ndarray) -> None:
    """system.parquet in the run directory (nothing without samples)."""
    if not len(samples):
        return
    import pandas as pd

    frame = pd.DataFrame(samples, columns=list(COLUMNS)).astype({"t_ns": "int64"})
    frame.to_parquet(run_dir / SYSTEM_FILE, index=False)


def join_to_steps(steps: Any, samples: Any) -> Any:
    """The steps with JOINED: the mean number of cores other processes (and the
    hypervisor) kept busy while each row computed (begin to ready), and the cores' mean
    clock, from the samples integrated over time (a step shorter than a sample interval
    gets that interval's value). Rows outside the sampled span get NaN."""
    out = steps.copy()
    if samples is None or not len(samples) or steps.empty:
        for name in JOINED:
            out[name] = np.nan
        return out
    t = samples["t_ns"].to_numpy(dtype=float)
    first = t[0] - (t[1] - t[0] if len(t) > 1 else INTERVAL_S * 1e9)
    edges = np.concatenate([[first], t])
    begin = steps["begin_ns"].to_numpy(dtype=float)
    ready = steps["ready_ns"].to_numpy(dtype=float)
    inside = (begin >= edges[0]) & (ready <= edges[-1]) & (ready > begin)
    for name in JOINED:
        # cumulative value x ns at each edge; its slope over [begin, ready] is the mean
        rate = samples[name].to_numpy(dtype=float)
        cumulative = np.concatenate([[0.0], np.cumsum(rate * np.diff(edges))])
        mean = (np.interp(ready, edges, cumulative) - np.interp(begin, edges, cumulative)) \
            / np.where(inside, ready - begin, 1.0)
        out[name] = np.where(inside, mean, np.nan)
    return out
