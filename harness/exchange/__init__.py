"""How workers' gradients or parameters meet: one interface, a registry of implementations.

The training loop (harness/loop/worker.py) calls `exchange(step, samples)` once per step, after
the worker's gradient sums and loss sum are in the communication buffer, and times the
call as the step's exchange phase (`allreduce_ns`, ready -> reduced). What the buffer
holds when it returns says what the loop does next (`Holds`):

- SUMS: gradient sums over `samples` samples (an all-reduce): the loop's optimizer turns
  them into the update, the adapter applies it;
- UPDATE: an update direction already computed, applied with `scale` (local SGD's local
  steps, whose optimizer runs on the worker's own samples);
- PARAMETERS: the new parameters (a parameter server's pull, local SGD's average): the
  adapter loads them.

The loop stays the one place phases are timed. An aggregator whose exchange has parts the
loop cannot see (a push to a server, a wait for other workers or a staleness bound, a
pull) reports their durations in the Exchange, measured on the host clock every process
of the host shares, and the records carry them (push_ns, wait_ns, pull_ns, staleness).

`asynchronous` says that the workers did not take this step's exchange together (a
parameter server's asynchronous push, a local step): then the aggregator measured each
worker's own wait, and that is its idle time. Otherwise (an all-reduce: every worker took
it together) idle is read off the records as always, arrival - ready (DESIGN.md,
docs/concepts/step.md).
A record of zeros is a synchronous step, as every record before aggregators was.

This module imports no framework: config validation and the launcher use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hetbench.adapters.base import Adapter, Loss
from hetbench.harness.spec.aggregators import kind
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.system.services import Services
from hetbench.harness.training.optim import Optimizer, OwnOptimizer

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup


class Holds(StrEnum):
    SUMS = "sums"
    UPDATE = "update"
    PARAMETERS = "parameters"


@dataclass(frozen=True)
class Exchange:
    """What one exchange did. `next_step` is the step this worker computes next (None: the
    run's budget is spent); `samples` are the samples the buffer's loss sum covers."""

    holds: Holds
    samples: int
    next_step: int | None
    scale: float = 0.0  # UPDATE only
    staleness: int = 0  # server version at apply minus the version computed on
    push_ns: int = 0
    wait_ns: int = 0
    pull_ns: int = 0
    asynchronous: bool = False
    dropped: bool = False  # the gradient arrived too late and was not used (backup)
    progress: int | None = None  # global steps applied after it (None: step + 1)


class Aggregator(Protocol):
    def exchange(self, step: int, samples: int) -> Exchange: ...

    def describe(self) -> dict[str, Any]:
        """What the manifest records of it (a parameter server's placement)."""
        ...

    def close(self, failed: bool = False) -> None:
        """The run ended; `failed`: by an error, so the peers may be gone or stuck: leave
        without waiting for them."""
        ...


class Unattached:
    """The aggregator of a trainer before its own is attached (the aggregator is built from
    the trainer's buffer and optimizer): any exchange is a mistake."""

    def exchange(self, step: int, samples: int) -> Exchange:
        raise RuntimeError("no aggregator attached to this trainer")

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self, failed: bool = False) -> None:
        pass


@runtime_checkable
class LeavesOut(Aggregator, Protocol):
    """An aggregator whose exchange can leave a worker out (`Kind.leaves_out`)."""

    def set_members(self, group: ProcessGroup | None, count: int) -> None:
        """Exchange among `count` members in the process group `group` (None: the whole
        job's) from now on."""
        ...


@runtime_checkable
class Overlaps(Aggregator, Protocol):
    """An aggregator that all-reduces the gradients in buckets while the backward pass still
    computes them (`Kind.overlaps`: DDP). The loop asks it when the backward handed over the
    last bucket (`backward_ended`): that is the step's `ready`, and what is left of the
    exchange after it is the exposed communication (DESIGN.md, "Idle under overlap")."""

    def backward_begins(self, loss: Loss, instant: int | None) -> None:
        """The backward of `loss` (the slice's loss sum) starts at `instant` (host clock;
        None: the step is not timed): the first bucket's computation is timed from here
        (the emulated slowdown stretches each bucket's); the loss is summed with the
        buckets."""
        ...

    def backward_ended(self) -> int | None:
        """The backward has returned (called before the loop packs the buffer, in every
        step, timed or not): when it handed the last bucket to the all-reduce; None when
        it handed none (computing alone)."""
        ...

    def alone(self) -> AbstractContextManager[None]:
        """Compute without exchanging (a worker timed alone while the others wait)."""
        ...


@runtime_checkable
class CountsTraffic(Aggregator, Protocol):
    """An aggregator that counts what it sent to and got from each server (the parameter
    servers): the worker's manifest entry `traffic` (analysis/measures/traffic.py)."""

    def traffic(self) -> dict[str, Any]:
        ...


@runtime_checkable
class AlignsServerClocks(Aggregator, Protocol):
    """An aggregator whose servers stamp on their own host's clock: the offsets it applied
    to those stamps (the manifest's `server_clocks`; none on the worker's own host)."""

    def server_clocks(self) -> list[dict[str, Any]]:
        ...


@runtime_checkable
class RecordsBuckets(Aggregator, Protocol):
    """An aggregator that records each gradient bucket of each step (DDP): the rows of
    buckets.parquet (collector.BUCKET_DTYPE)."""

    def bucket_records(self) -> Any:  # a BUCKET_DTYPE array (numpy: not imported here)
        ...


@dataclass(frozen=True)
class Context:
    """What an aggregator is built from, in one worker process."""

    run: RunSpec
    rank: int
    adapter: Adapter
    buffer: torch.Tensor  # the communication buffer: gradient sums, loss sum last
    optimizer: Optimizer | OwnOptimizer  # the worker's (OwnOptimizer: a job's own steps)
    initial: torch.Tensor  # the initial parameters, flat float32 in spec order
    run_dir: Path
    stretch: Stretcher | None = None  # the worker's emulated slowdown (Overlaps stretch it)


def _load(target: str) -> Any:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def prepare(run: RunSpec, rank: int) -> None:
    """What the run's aggregator must do in a worker before the adapter exists."""
    target = kind(run.aggregator.name).prepare
    if target is not None:
        _load(target)(run, rank)


def serve(run: RunSpec, run_dir: Path, rank: int) -> None:
    """What a worker process of a coordinator-driven aggregator runs instead of the loop."""
    target = kind(run.aggregator.name).serves
    assert target is not None
    _load(target)(run, run_dir, rank)


def create(context: Context) -> Aggregator:
    return _load(kind(context.run.aggregator.name).target)(context)  # type: ignore[no-any-return]


def next_step(step: int, steps: int) -> int | None:
    """The step after `step` in a run of `steps` steps every worker takes (lockstep)."""
    return step + 1 if step + 1 < steps else None


def start_services(run: RunSpec, free_port: Callable[[], int], logs: Path, run_dir: Path,
                   services: Services) -> None:
    """The processes the run's aggregator needs beside the workers (none for most), and
    what the workers must be told, added to `services` by the aggregator's own starter
    (`Kind.services`); the launcher stops them."""
    target = kind(run.aggregator.name).services
    if target is None:
        return
    module, attr = target.split(":")
    starter = getattr(importlib.import_module(module), attr)
    starter(run, free_port, logs, run_dir, services)
