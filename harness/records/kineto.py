"""A job's torch.profiler traces (Kineto's Chrome trace JSON, one file per rank, the layout
Holistic Trace Analysis reads) as hetbench's step records: what `hetbench import` writes
into a run directory, so that a job hetbench never ran can be reported, simulated and
advised on.

Per rank and profiled step (a `ProfilerStep#N` annotation, torch.profiler's own or
hetbench's), on the trace's clock (microseconds; one host's ranks share it):
- begin and end: the annotation's span;
- ready: the start of the step's last all-reduce call on the training thread
  (`c10d::allreduce_`: the instant the last gradients were handed to the exchange, the one
  call of a phase-separated step, DDP's last bucket);
- reduced: the end of the last collective that call started (`gloo:all_reduce` or
  `nccl:all_reduce` on the backend's thread: its span holds the wait for the slowest rank);
- load: the DataLoader's `enumerate(DataLoader)#...` spans in the step; forward up to the
  first autograd function (`autograd::engine::evaluate_function: ...`); backward to ready;
  allreduce from ready to reduced; apply to the step's end (an `Optimizer.step#...` span
  is in it).
Idle before the all-reduce and the exchange then follow from these instants as for any run
(DESIGN.md, Metrics). A trace cannot give: the slices (`--global-batch`, `--sizes`), the
loss, an emulated slowdown, the CPU time, context switches, RSS and the garbage
collector's time of a step (recorded as not measured), nor the split of the exchange from
to_device, pack and unpack (0).
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetbench.harness.records import collector
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import IMPORTED_DATASET  # noqa: F401  (hetbench import's)

STEP = re.compile(r"ProfilerStep#(\d+)$")
COLLECTIVE = re.compile(r"(gloo|nccl):all_?reduce$")
ENQUEUE = "c10d::allreduce_"
BACKWARD_PREFIX = "autograd::engine::evaluate_function"
LOADER_PREFIX = "enumerate(DataLoader)"
TRACE_SUFFIXES = (".json", ".json.gz")
# a trace's instants become int64 nanoseconds: ts up to ~292 years of microseconds (Kineto's
# are since the epoch, 1.8e15 in 2026); an event up to a day long
TS_MAX_US = 9.2e15
DUR_MAX_US = 86_400e6
MAX_BYTES = 1 << 30  # of one trace unpacked
MAX_BYTES_VARIABLE = "HETBENCH_IMPORT_MAX_BYTES"
# what a trace cannot give, recorded as not measured (or 0)
NOT_IN_TRACE = ["batch sizes (--global-batch, --sizes)", "loss", "emulated slowdown",
                "CPU time, context switches, RSS and GC time of a step",
                "to_device, pack and unpack (0)"]


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace: its rank, world size and backend (distributedInfo), its host, the
    file, and its complete events ("ph": "X") as (name, tid, start ns, end ns)."""

    rank: int
    world_size: int
    backend: str
    host: str
    path: Path
    events: list[tuple[str, str, int, int]]
    exchanged: list[tuple[int, int]]  # each all-reduce call's start and its elements


def trace_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise UsageError(str(folder), "not a folder (a job's torch.profiler traces: one file "
                         "per rank, *.json or *.json.gz)")
    found = sorted(p for p in folder.iterdir() if p.name.endswith(TRACE_SUFFIXES))
    if not found:
        raise UsageError(str(folder), "holds no trace (*.json or *.json.gz, as "
                         "torch.profiler's export_chrome_trace writes them)")
    return found


def read_trace(path: Path) -> RankTrace:
    """One rank's trace, its rank from the distributedInfo torch.distributed adds; every
    field hetbench reads checked for its type and range (UsageError naming the file and
    the field)."""
    data = _read_json(path)
    info = data.get("distributedInfo") if isinstance(data, dict) else None
    if not isinstance(info, dict) or not _whole(info.get("rank")):
        raise UsageError(str(path), "no distributedInfo with the rank: a trace of a "
                         "torch.distributed job, profiled after init_process_group")
    world = info.get("world_size", 0)
    if not _whole(world) or not 0 <= info["rank"] < world:
        raise UsageError(f"{path}: distributedInfo.world_size", f"{world!r}: a whole number "
                         f"of ranks above the rank {info['rank']}")
    listed = data.get("traceEvents") or []
    if not isinstance(listed, list):
        raise UsageError(f"{path}: traceEvents", "not a list of events")
    events, exchanged = [], []
    for n, event in enumerate(listed):
        if isinstance(event, dict) and event.get("ph") == "X" and "dur" in event:
            start = _microseconds(event.get("ts"), f"{path}: traceEvents[{n}].ts", TS_MAX_US)
            duration = _microseconds(event["dur"], f"{path}: traceEvents[{n}].dur", DUR_MAX_US)
            name = str(event.get("name", ""))
            events.append((name, str(event.get("tid", "")), start, start + duration))
            if name == ENQUEUE:
                args = event.get("args")
                exchanged.append((start, _elements(args if isinstance(args, dict) else {})))
    return RankTrace(info["rank"], world, str(info.get("backend", "")),
                     str(data.get("host_name", "")), path, events, sorted(exchanged))


def _read_json(path: Path) -> Any:
    """The file's JSON: a regular file only (a FIFO would block for ever), at most
    max_bytes() of it unpacked (a small gzip file can unpack to gigabytes)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise UsageError(str(path), "not a regular file: a trace is read from a file")
        limit = max_bytes()
        opener: Any = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as file:
            raw = file.read(limit + 1)
        if len(raw) > limit:
            raise UsageError(str(path), f"more than {limit} bytes unpacked (at most "
                             f"{MAX_BYTES_VARIABLE} bytes, default {MAX_BYTES})")
        return json.loads(raw)
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(str(path), f"not a readable trace ({exc})") from None
    except RecursionError:
        raise UsageError(str(path), "not a readable trace (JSON nested too deep)") from None


def max_bytes() -> int:
    value = os.environ.get(MAX_BYTES_VARIABLE, "")
    return int(value) if value.isdigit() else MAX_BYTES


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _microseconds(value: Any, where: str, most: float) -> int:
    """A trace's time in microseconds (a number, finite, 0..most) as whole nanoseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not 0 <= value <= most:
        raise UsageError(where, f"{value!r}: microseconds, a finite number from 0 to "
                         f"{most:g}")
    return int(round(value * 1000))


def _elements(args: dict[str, Any]) -> int:
    """The elements an all-reduce call exchanged: its tensors' sizes (its "Input Dims");
    0 (not said) where they are not lists of whole numbers."""
    dims = args.get("Input Dims") or []
    if not isinstance(dims, list):
        return 0
    tensors = dims[0] if dims and isinstance(dims[0], list) and dims[0] \
        and isinstance(dims[0][0], list) else dims[:1]
    total = 0
    for d in tensors:
        if isinstance(d, list) and d:
            if not all(_whole(n) and 0 <= n < 2 ** 40 for n in d):
                return 0
            total += math.prod(d)
    return total


def exchanged_per_step(trace: RankTrace, spans: dict[int, StepSpan]) -> int:
    """The elements one step's all-reduce calls exchanged (the model's gradients and what
    the job adds to them), in the first step imported; 0 where the trace does not say."""
    if not spans:
        return 0
    first = spans[min(spans)]
    return sum(n for start, n in trace.exchanged if first.begin <= start <= first.end)


def read_job(folder: Path) -> list[RankTrace]:
    """Every rank's trace in the folder, in rank order; one per rank of one job."""
    traces = sorted((read_trace(p) for p in trace_files(folder)), key=lambda t: t.rank)
    ranks = [t.rank for t in traces]
    world = traces[0].world_size
    if ranks != list(range(world)) or any(t.world_size != world for t in traces):
        raise UsageError(str(folder), f"traces of ranks {ranks}, world size "
                         f"{sorted({t.world_size for t in traces})}: one trace per rank of "
                         "one job is needed")
    return traces


@dataclass(frozen=True)
class StepSpan:
    begin: int
    loaded: int  # the end of the DataLoader's waits in the step (begin where there is none)
    backward: int  # the first autograd function's start
    ready: int
    reduced: int
    end: int


def steps_of(trace: RankTrace) -> dict[int, StepSpan]:
    """Each profiled step's instants on this rank (those with an all-reduce), found by
    bisection in the events sorted once (time linear in the events, not their product
    with the steps). Steps whose spans go back in time are refused by name."""
    spans = sorted((int(m.group(1)), start, end) for name, _, start, end in trace.events
                   if (m := STEP.match(name)))
    _refuse_backwards(trace, spans)
    enqueued = sorted(start for name, _, start, _ in trace.events if name == ENQUEUE)
    collectives = sorted((start, end) for name, _, start, end in trace.events
                         if COLLECTIVE.match(name))
    collective_starts = [start for start, _ in collectives]
    backward = sorted(start for name, _, start, _ in trace.events
                      if name.startswith(BACKWARD_PREFIX))
    loads = sorted((start, end) for name, _, start, end in trace.events
                   if name.startswith(LOADER_PREFIX))
    load_starts = [start for start, _ in loads]
    found: dict[int, StepSpan] = {}
    for step, begin, end in spans:
        calls = enqueued[bisect.bisect_left(enqueued, begin):bisect.bisect_right(enqueued, end)]
        if not calls:
            continue
        ready = calls[-1]
        first = bisect.bisect_left(collective_starts, ready)
        done = collectives[first][1] if first < len(collectives) \
            and collective_starts[first] <= end else ready
        reduced = min(max(done, ready), end)
        at = bisect.bisect_left(backward, begin)
        first_backward = backward[at] if at < len(backward) and backward[at] <= ready \
            else ready
        in_step = loads[bisect.bisect_left(load_starts, begin):
                        bisect.bisect_right(load_starts, end)]
        loaded = max([e for _, e in in_step] or [begin])
        found[step] = StepSpan(begin, min(loaded, first_backward), first_backward, ready,
                               reduced, end)
    return found


def _refuse_backwards(trace: RankTrace, spans: list[tuple[int, int, int]]) -> None:
    """A rank's profiled steps follow one another: one beginning before the one numbered
    before it ended is a damaged trace (its clock, or its numbers)."""
    for (before, _, ended), (step, began, _) in zip(spans, spans[1:], strict=False):
        if step != before and began < ended:  # (one step annotated twice: kept)
            raise UsageError(f"{trace.path}: ProfilerStep#{step}", f"begins "
                             f"{(ended - began) / 1e3:g} us before ProfilerStep#{before} "
                             "ends: a rank's steps follow one another in time")


def records(traces: list[RankTrace], sizes: tuple[int, ...]
            ) -> tuple[np.ndarray, list[int], list[int]]:
    """RECORD_DTYPE rows of the steps every rank recorded (numbered as the profiler numbered
    them: ProfilerStep#4 is step 4, as in the trace's viewers), the steps only some did, and
    the numbers of those kept."""
    per_rank = [steps_of(t) for t in traces]
    common = sorted(set.intersection(*(set(s) for s in per_rank)))
    partial = sorted(set.union(*(set(s) for s in per_rank)) - set(common))
    rows = np.zeros(len(common) * len(traces), dtype=collector.RECORD_DTYPE)
    starts = np.cumsum((0, *sizes[:-1]))
    i = 0
    for rank, spans in enumerate(per_rank):
        for step in common:
            s = spans[step]
            row = rows[i]
            row["rank"], row["step"] = rank, step
            row["batch_size"], row["slice_start"] = sizes[rank], starts[rank]
            row["begin_ns"], row["ready_ns"] = s.begin, s.ready
            row["reduced_ns"], row["end_ns"] = s.reduced, s.end
            row["load_ns"] = s.loaded - s.begin
            row["forward_ns"] = s.backward - s.loaded
            row["backward_ns"] = s.ready - s.backward
            row["allreduce_ns"] = s.reduced - s.ready
            row["apply_ns"] = s.end - s.reduced
            i += 1
    for name in collector.SAMPLED_FIELDS + ("rss_bytes",):
        rows[name] = collector.UNMEASURED
    rows["loss"] = rows["local_loss"] = np.nan
    return rows, partial, common
