"""A real input pipeline for the load phase: batches of the next steps are made ahead by
background threads or processes (decode, augment, the workload's own preparation), as
torch's DataLoader does with its workers and prefetch factor. The load phase of a step then
measures how long the training loop waited for its batch, and the pipeline's work competes
with compute for the worker's cores: a variability source of its own (Choi et al.'s
captioning runs loaded this way).

Batches are keyed by (step, lo, hi): when an adaptive partition moves a worker's slice, the
batches made for the old slice are dropped and the new ones made. Every wait has the run's
timeout.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from hetbench.harness.spec.loaders import LoaderSpec

PR_SET_PDEATHSIG = 1

Batch = tuple[Any, Any]
_make_in_child: Callable[[int, int, int], Batch] | None = None


def _child_init(make: Callable[[int, int, int], Batch]) -> None:
    """In a forked loader process: die with the worker, keep its batch function."""
    global _make_in_child
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the worker's to handle
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    _make_in_child = make


def _child_make(step: int, lo: int, hi: int) -> Batch:
    assert _make_in_child is not None
    return _make_in_child(step, lo, hi)


class Prefetcher:
    def __init__(self, make: Callable[[int, int, int], Batch], spec: LoaderSpec, steps: int,
                 timeout_s: float) -> None:
        self.depth, self.steps, self.timeout_s = spec.prefetch, steps, timeout_s
        self._pool: Executor
        if spec.kind == "threads":
            self._pool = ThreadPoolExecutor(spec.workers, thread_name_prefix="hetbench-loader")
            self._submit: Callable[[int, int, int], Future[Batch]] = (
                lambda *key: self._pool.submit(make, *key))
        else:
            # fork: the children share the worker's data sets without a copy or a pickle
            self._pool = ProcessPoolExecutor(spec.workers, multiprocessing.get_context("fork"),
                                             initializer=_child_init, initargs=(make,))
            self._submit = lambda *key: self._pool.submit(_child_make, *key)
        self._pending: dict[tuple[int, int, int], Future[Batch]] = {}

    def get(self, step: int, lo: int, hi: int) -> Batch:
        """Step `step`'s slice [lo, hi), then the next `prefetch` steps' are queued."""
        future = self._pending.pop((step, lo, hi), None) or self._submit(step, lo, hi)
        for key in [k for k in self._pending if k[0] <= step or k[1:] != (lo, hi)]:
            self._pending.pop(key).cancel()  # passed, or made for a slice that moved
        for ahead in range(step + 1, min(step + 1 + self.depth, self.steps)):
            if (ahead, lo, hi) not in self._pending:
                self._pending[(ahead, lo, hi)] = self._submit(ahead, lo, hi)
        return future.result(timeout=self.timeout_s)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
