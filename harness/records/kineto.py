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

import gzip
import json
import re
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
    """One rank's trace, its rank from the distributedInfo torch.distributed adds."""
    try:
        opener: Any = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as file:
            data = json.load(file)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(str(path), f"not a readable trace ({exc})") from None
    info = data.get("distributedInfo") if isinstance(data, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("rank"), int):
        raise UsageError(str(path), "no distributedInfo with the rank: a trace of a "
                         "torch.distributed job, profiled after init_process_group")
    events, exchanged = [], []
    for event in data.get("traceEvents") or []:
        if isinstance(event, dict) and event.get("ph") == "X" and "dur" in event:
            start = int(round(float(event["ts"]) * 1000))
            name = str(event.get("name", ""))
            events.append((name, str(event.get("tid", "")), start,
                           start + int(round(float(event["dur"]) * 1000))))
            if name == ENQUEUE:
                exchanged.append((start, _elements(event.get("args") or {})))
    return RankTrace(info["rank"], int(info.get("world_size", 0)),
                     str(info.get("backend", "")), str(data.get("host_name", "")), path,
                     events, sorted(exchanged))


def _elements(args: dict[str, Any]) -> int:
    """The elements an all-reduce call exchanged: its tensors' sizes (its "Input Dims")."""
    dims = args.get("Input Dims") or []
    tensors = dims[0] if dims and isinstance(dims[0], list) and dims[0] \
        and isinstance(dims[0][0], list) else dims[:1]
    return sum(int(np.prod(d)) for d in tensors if isinstance(d, list) and d)


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
    """Each profiled step's instants on this rank (those with an all-reduce)."""
    spans = sorted((int(m.group(1)), start, end) for name, _, start, end in trace.events
                   if (m := STEP.match(name)))
    enqueued = sorted(start for name, _, start, _ in trace.events if name == ENQUEUE)
    collectives = sorted((start, end) for name, _, start, end in trace.events
                         if COLLECTIVE.match(name))
    backward = sorted(start for name, _, start, _ in trace.events
                      if name.startswith(BACKWARD_PREFIX))
    loads = [(start, end) for name, _, start, end in trace.events
             if name.startswith(LOADER_PREFIX)]
    found: dict[int, StepSpan] = {}
    for step, begin, end in spans:
        calls = [t for t in enqueued if begin <= t <= end]
        if not calls:
            continue
        ready = calls[-1]
        done = [e for s, e in collectives if s >= ready and s <= end] or [ready]
        reduced = min(max(done[0], ready), end)
        first_backward = next((t for t in backward if begin <= t <= ready), ready)
        loaded = max([e for s, e in loads if begin <= s <= end] or [begin])
        found[step] = StepSpan(begin, min(loaded, first_backward), first_backward, ready,
                               reduced, end)
    return found


def records(traces: list[RankTrace], sizes: tuple[int, ...]
            ) -> tuple[np.ndarray, list[int], list[int]]:
    """RECORD_DTYPE rows of the steps every rank recorded (numbered from 0), the steps only
    some did, and the profiler's numbers of those kept."""
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
            row["rank"], row["step"] = rank, common.index(step)
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
