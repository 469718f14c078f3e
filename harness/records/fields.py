"""A step record's fields, declared once: each field's name, its type, who writes it, what
it means and what a run recorded before it existed reads as. From these the collector
makes the record's dtype (`collector.RECORD_DTYPE`, the row builders' order, checked by
tests/test_collector.py), the reader fills older runs' missing columns
(`results.checked_steps`), the docs build the results reference (docs/hooks/reference.py),
and analysis knows which fields are sampled (`SAMPLED`). Adding a field: its entry here,
its place in the collector's row builders, and the code that measures it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    LOAD = "load"
    TO_DEVICE = "to_device"
    FORWARD = "forward"
    BACKWARD = "backward"
    PACK = "pack"
    ALLREDUCE = "allreduce"
    UNPACK = "unpack"
    APPLY = "apply"


PHASES: tuple[Phase, ...] = tuple(Phase)
# Phases before `ready` (gradients in the communication buffer): what a slowdown stretches.
COMPUTE_PHASES: tuple[Phase, ...] = PHASES[: PHASES.index(Phase.PACK) + 1]

# Who writes a field, in the order the record holds them
WRITERS = {
    "loop": "the loop, as the step begins: who, which step, which slice",
    "timer": "the phase timer's marks (harness/loop/timer.py)",
    "emulation": "the emulated slowdown (harness/spec/emulation.py)",
    "cpu": "the kernel's counts over the compute (harness/loop/counters.py)",
    "loss": "the exchanged loss sums",
    "counters": "the step's counters (harness/loop/counters.py)",
    "exchange": "the aggregator's Exchange (harness/exchange)",
}
# a field every recorded run has: no value stands in for it
EVERY_RUN = object()


@dataclass(frozen=True)
class Field:
    name: str
    dtype: str  # numpy's: "<i4", "<i8", "<f8", "?"
    writer: str  # a key of WRITERS
    description: str  # the results reference's
    # what a run recorded before the field existed reads as (EVERY_RUN: none lacks it;
    # None: left missing, analysis does without it)
    older: Any = EVERY_RUN
    # may hold UNMEASURED (-1): read over one step in a run's counters_every, or not counted
    # on the host that ran the worker
    sampled: bool = False


_NOT_SAMPLED = " (-1: a step between the sampled ones, counters_every)"
_NOT_COUNTED = " (-1: not counted on this host: the manifest's workers[].counters say why)"

STEP_FIELDS: tuple[Field, ...] = (
    Field("rank", "<i4", "loop", "the worker"),
    Field("step", "<i8", "loop", "the step (under pipelines: the wave)"),
    Field("batch_size", "<i4", "loop", "samples in the worker's slice (0: left out of the step)"),
    Field("slice_start", "<i4", "loop", "the slice's first sample in the global batch"),
    Field("begin_ns", "<i8", "timer", "step begins (perf_counter_ns, on rank 0's clock)"),
    Field("ready_ns", "<i8", "timer", "gradient and loss sums in the communication buffer"),
    Field("reduced_ns", "<i8", "timer", "the exchange returned"),
    Field("end_ns", "<i8", "timer", "update applied"),
    *(Field(f"{p.value}_ns", "<i8", "timer", f"the {p.value} phase's time") for p in PHASES),
    Field("stretch_ns", "<i8", "emulation", "emulated slowdown inside the compute phases"),
    Field("stretch_wait_ns", "<i8", "emulation", "of the stretch, the time the main thread "
          "waited for a CPU to wake on from its sleeps (schedstat; 0: not slowed)",
          older=None),
    Field("stretch_cpu_ns", "<i8", "emulation", "of the stretch, the main thread's CPU time "
          "(its sleeps' calls; 0: not slowed)", older=None),
    # Over the compute (begin to ready), what the kernel counted (harness/loop/counters.py):
    # of the main thread, which drives the step (wall minus its CPU time and its wait for a
    # CPU is time it was blocked), and of all the worker's threads and the processes they
    # started (intra-op pools, a DataLoader's processes: work done on its behalf)
    Field("compute_cpu_ns", "<i8", "cpu",
          "CPU time of the main thread from begin to ready", older=None, sampled=True),
    Field("compute_cpu_all_ns", "<i8", "cpu",
          "CPU time of all the worker's threads and their processes from begin to ready "
          "(perf's task-clock; without perf events: the threads' CPU clocks, on one step in "
          "counters_every, -1 on the others)", older=None, sampled=True),
    Field("compute_wait_ns", "<i8", "cpu",
          "time the main thread waited on a run queue for a CPU from begin to ready "
          "(schedstat)" + _NOT_COUNTED, older=None, sampled=True),
    Field("compute_slices", "<i8", "cpu",
          "times the main thread was put on a CPU from begin to ready (schedstat)"
          + _NOT_COUNTED, older=None, sampled=True),
    *(Field(f"compute_{name}", "<i8", "cpu", f"{meaning} of all the worker's threads and "
            f"their processes from begin to ready (perf)" + _NOT_COUNTED, older=None,
            sampled=True)
      for name, meaning in (("faults", "minor page faults"), ("major_faults", "major page faults"),
                            ("switches", "context switches"), ("migrations", "CPU migrations"),
                            ("instructions", "instructions"), ("cycles", "CPU cycles"),
                            ("cache_misses", "cache misses"))),
    Field("loss", "<f8", "loss", "global mean loss"),
    Field("local_loss", "<f8", "loss", "this worker's mean loss"),
    Field("ctx_voluntary", "<i8", "counters",
          "voluntary context switches in the step (getrusage; -1: not sampled)", sampled=True),
    Field("ctx_involuntary", "<i8", "counters",
          "involuntary context switches in the step (getrusage; -1: not sampled)",
          sampled=True),
    Field("cpu_user_ns", "<i8", "counters",
          "user CPU time in the step (getrusage; -1: not sampled)", sampled=True),
    Field("cpu_system_ns", "<i8", "counters",
          "system CPU time in the step (getrusage; -1: not sampled)", sampled=True),
    Field("rss_bytes", "<i8", "counters",
          "resident memory, read at most every 8 steps and held between"),
    Field("gc_ns", "<i8", "counters", "time in Python's garbage collector (gc.callbacks)"),
    Field("gc_collections", "<i4", "counters", "garbage collections in the step"),
    # the aggregator's view of the exchange: staleness of the update, the parts of the
    # exchange it measured, whether the workers did not take it together (then idle is the
    # measured wait), whether this gradient was dropped. Rows written before aggregators
    # existed are all-reduce steps.
    Field("staleness", "<i8", "exchange", "server version at apply minus the version computed "
          "on (0: synchronous, -1: not reported)", older=0),
    Field("push_ns", "<i8", "exchange", "the exchange's push to the server", older=0),
    Field("wait_ns", "<i8", "exchange", "the exchange's wait for other workers or the bound",
          older=0),
    Field("pull_ns", "<i8", "exchange", "the exchange's pull (the update and the way back)",
          older=0),
    Field("asynchronous", "?", "exchange",
          "the workers did not take this exchange together (idle = wait_ns)", older=False),
    Field("dropped", "?", "exchange", "the gradient came too late and was not used (backup)",
          older=False),
)

NAMES: tuple[str, ...] = tuple(f.name for f in STEP_FIELDS)
BY_NAME: dict[str, Field] = {f.name: f for f in STEP_FIELDS}
assert len(BY_NAME) == len(STEP_FIELDS), "a field declared twice"
assert all(f.writer in WRITERS for f in STEP_FIELDS)
# fields older runs may lack, and what they read as (None: left missing)
OLDER: dict[str, Any] = {f.name: f.older for f in STEP_FIELDS if f.older is not EVERY_RUN}
SAMPLED: tuple[str, ...] = tuple(f.name for f in STEP_FIELDS if f.sampled)


def written_by(writer: str) -> tuple[str, ...]:
    """The fields `writer` fills, in the record's order."""
    return tuple(f.name for f in STEP_FIELDS if f.writer == writer)
