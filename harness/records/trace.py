"""trace.json: a run's steps as Chrome trace events (Perfetto, chrome://tracing), in
microseconds, derived from steps.parquet after the run is closed (rundir.py).

One process per worker, pid rank + 1 (viewers treat pid 0 as the idle task), named with
the worker's label (framework, device, threads, slowdown). Per worker and step a parent
slice `step N` whose phases nest in it and tile it from begin to end (`slice_table`): the
exchange split as the analysis splits it, idle before it and communication apart. A flow
arrow per step from the straggler (the last worker ready) to every worker that waited for
it, landing where its communication starts. Counter tracks per worker: its slice size and
resident memory, an event where they change.

Vectorised: the events of a chunk of rows are computed as numpy arrays and turned into JSON
text by pyarrow's compute kernels (one template per event type, numbers formatted as
integers), and the text buffer is written as it is. A million records write in seconds;
`window` bounds a long run's trace to the steps a viewer can hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hetbench.harness.records.collector import PHASES, TRACE_FILE, Phase

CHUNK_ROWS = 100_000  # rows turned into events at a time (about 130 MB of text)
# The most rows (worker-steps) a trace holds, about 1.3 KB of JSON each: Perfetto's UI runs
# in the browser's memory (about 2 GB, and a trace takes 2-4x its size there) and
# chrome://tracing stopped at 256 MB; 900 MB traces are reported to crash it.
MAX_ROWS = 100_000
MIB = 1 << 20
_EXCHANGE = PHASES.index(Phase.ALLREDUCE)
_BEFORE = [p.value for p in PHASES[:_EXCHANGE]]
_AFTER = [p.value for p in PHASES[_EXCHANGE + 1:]]
# the exchange's parts: taken together (idle, then the all-reduce after the last arrival)
# or alone (asynchronous: push, wait, pull)
_TOGETHER, _ALONE = ("idle", "allreduce", ""), ("push", "wait", "pull")
PART_NAMES = (*_BEFORE, "exchange 1", "exchange 2", "exchange 3", *_AFTER)


def window(frame: Any, steps: int | tuple[int, int] | None) -> Any:
    """The rows a trace holds: the last `steps` steps (an int), steps a to b inclusive (a
    pair), or all (None); of those, the last steps whose rows number at most MAX_ROWS. A
    worker left out of a step has no slices."""
    frame = frame[frame["batch_size"] > 0]
    if steps is not None and len(frame):
        if isinstance(steps, tuple):
            frame = frame[frame["step"].between(*steps)]
        else:
            frame = frame[frame["step"] > frame["step"].max() - steps]
    if len(frame) > MAX_ROWS:
        rows_from = frame.groupby("step").size().iloc[::-1].cumsum()
        frame = frame[frame["step"] >= rows_from[rows_from <= MAX_ROWS].index.min()]
    return frame


def recorded_window(value: Any) -> int | tuple[int, int]:
    """`trace_steps` as a manifest holds it (a window as a JSON list)."""
    return (int(value[0]), int(value[1])) if isinstance(value, list | tuple) else int(value)


def write_trace(run_dir: Path, frame: Any, worker_labels: list[str],
                steps: int | tuple[int, int] | None = None) -> None:
    """trace.json of `frame` (steps.parquet's rows) within `window(frame, steps)`; 0: none."""
    if steps == 0:
        return
    frame = window(frame, steps)
    tmp = run_dir / f".{TRACE_FILE}.tmp"
    with open(tmp, "wb") as out:
        out.write(b'{"displayTimeUnit": "ms", "traceEvents": [\n')
        out.write(",\n".join(json.dumps({"ph": "M", "name": "process_name", "pid": rank + 1,
                                         "tid": 0, "args": {"name": f"worker {rank} ({label})"}})
                             for rank, label in enumerate(worker_labels)).encode())
        if len(frame):
            origin = int(frame["begin_ns"].min())
            arrival = frame.groupby("step")["ready_ns"].transform("max").to_numpy()
            last = frame.loc[frame.groupby("step")["ready_ns"].idxmax(), ["step", "rank"]]
            straggler = frame["step"].map(dict(zip(last["step"], last["rank"], strict=True)))
            counters = counter_changes(frame)
            for start in range(0, len(frame), CHUNK_ROWS):
                chunk = slice(start, start + CHUNK_ROWS)
                rows = frame.iloc[chunk]
                for text in (_slices_json(slice_table(rows, arrival[chunk], origin)),
                             _flows_json(rows, arrival[chunk], straggler.to_numpy()[chunk],
                                         origin),
                             _counters_json(rows, {k: v[chunk] for k, v in counters.items()},
                                            origin)):
                    _write_events(out, text)
        out.write(b"\n]}\n")
    tmp.replace(run_dir / TRACE_FILE)


def slice_table(rows: Any, arrival: Any, origin: int) -> dict[str, np.ndarray]:
    """Each row's parent slice, then its phases in order from its begin (row by row): the
    compute phases; the exchange as `idle` (waiting for the last worker's gradients:
    arrival - ready) and `allreduce` (the rest), or, where the worker took its exchange
    alone (`asynchronous`), as `push`, `wait` (for others or a staleness bound) and `pull`;
    then unpack and apply. A row of a run with instrument = false (no phase timed) is its
    parent slice alone. Arrays: pid, step, name, cat (step/phase), ts_ns and dur_ns from
    `origin`, batch_size (of the row)."""
    n = len(rows)
    durations = np.stack([rows[f"{p.value}_ns"].to_numpy(np.int64) for p in PHASES], axis=1)
    ready, begin = rows["ready_ns"].to_numpy(np.int64), rows["begin_ns"].to_numpy(np.int64)
    alone = (rows["asynchronous"].to_numpy(bool) if "asynchronous" in rows
             else np.zeros(n, bool))
    total = durations[:, _EXCHANGE]
    idle = np.minimum(np.maximum(np.asarray(arrival, np.int64) - ready, 0), total)
    push = rows["push_ns"].to_numpy(np.int64) if "push_ns" in rows else np.zeros(n, np.int64)
    wait = rows["wait_ns"].to_numpy(np.int64) if "wait_ns" in rows else np.zeros(n, np.int64)
    exchange = np.where(alone[:, None],
                        np.stack([push, wait, np.maximum(total - push - wait, 0)], axis=1),
                        np.stack([idle, total - idle, np.zeros(n, np.int64)], axis=1))
    parts = np.concatenate([durations[:, :_EXCHANGE], exchange, durations[:, _EXCHANGE + 1:]],
                           axis=1)
    names = np.tile(np.array(PART_NAMES, dtype=object), (n, 1))
    names[:, _EXCHANGE:_EXCHANGE + 3] = np.where(alone[:, None], np.array(_ALONE, object),
                                                 np.array(_TOGETHER, object))
    starts = begin[:, None] - origin + np.cumsum(parts, axis=1) - parts
    timed = ready > 0
    present = np.repeat(timed[:, None], parts.shape[1], axis=1)
    present[:, _EXCHANGE + 2] &= alone  # the third part of a shared exchange is none
    step, batch = rows["step"].to_numpy(np.int64), rows["batch_size"].to_numpy(np.int64)
    pid = rows["rank"].to_numpy(np.int64) + 1
    width = parts.shape[1] + 1  # the parent, then the parts, row by row
    table = {
        "pid": np.repeat(pid, width), "step": np.repeat(step, width),
        "batch_size": np.repeat(batch, width),
        "name": np.concatenate([np.array([f"step {s}" for s in step], object)[:, None], names],
                               axis=1).ravel(),
        "cat": np.tile(np.array(["step", *["phase"] * parts.shape[1]], object), n),
        "ts_ns": np.concatenate([(begin - origin)[:, None], starts], axis=1).ravel(),
        "dur_ns": np.concatenate([(rows["end_ns"].to_numpy(np.int64) - begin)[:, None], parts],
                                 axis=1).ravel(),
    }
    keep = np.concatenate([np.ones((n, 1), bool), present], axis=1).ravel()
    return {k: v[keep] for k, v in table.items()}


def counter_changes(frame: Any) -> dict[str, np.ndarray]:
    """Per row, whether its worker's slice size, or its resident memory (positive, MiB to
    0.1), differs from the worker's last value in row order (the first always does)."""
    rank = frame["rank"].to_numpy()
    batch = frame["batch_size"].to_numpy(np.int64)
    rss = np.round(frame["rss_bytes"].to_numpy(np.float64) / MIB * 10).astype(np.int64)
    return {"slice": _changed(rank, batch, np.ones(len(frame), bool)),
            "rss": _changed(rank, rss, rss > 0), "rss_tenths": rss}


def _changed(rank: np.ndarray, values: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """Rows (among `counted`) whose value differs from the previous counted row of their
    rank."""
    out = np.zeros(len(values), bool)
    for r in np.unique(rank):
        where = np.flatnonzero((rank == r) & counted)
        if len(where):
            v = values[where]
            out[where] = np.concatenate([[True], v[1:] != v[:-1]])
    return out


# -- JSON text, one template per event type --------------------------------------------

def _us(ns: np.ndarray) -> Any:
    """Nanoseconds (non-negative integers) as microseconds with 3 decimals: '12.345'."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ns = np.maximum(ns, 0)
    return pc.binary_join_element_wise(
        pc.cast(pa.array(ns // 1000), pa.string()),
        pc.utf8_lpad(pc.cast(pa.array(ns % 1000), pa.string()), 3, "0"), ".")


def _text(values: np.ndarray) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    if values.dtype == object:
        return pa.array(values, pa.string())
    return pc.cast(pa.array(values), pa.string())


def _join(*parts: Any) -> Any:
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(*parts, "")


def _slices_json(t: dict[str, np.ndarray]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    extra = pc.if_else(pa.array(t["cat"] == "step"),
                       _join(',"batch_size":', _text(t["batch_size"])), "")
    return _join('{"ph":"X","name":"', _text(t["name"]), '","cat":"', _text(t["cat"]),
                 '","pid":', _text(t["pid"]), ',"tid":0,"ts":', _us(t["ts_ns"]), ',"dur":',
                 _us(t["dur_ns"]), ',"args":{"step":', _text(t["step"]), extra, "}}")


def _flows_json(rows: Any, arrival: np.ndarray, straggler: np.ndarray, origin: int) -> Any:
    """Per waiting worker of a lockstep step: an arrow from the straggler's ready (where
    its communication starts) to where the waiting worker's communication starts; the
    start ('s') then the end ('f') of each, row by row."""
    alone = (rows["asynchronous"].to_numpy(bool) if "asynchronous" in rows
             else np.zeros(len(rows), bool))
    rank = rows["rank"].to_numpy(np.int64)
    waits = ~alone & (rank != straggler) & (rows["ready_ns"].to_numpy() > 0)
    rank, step = rank[waits], rows["step"].to_numpy(np.int64)[waits]
    ts = np.repeat(np.asarray(arrival, np.int64)[waits] - origin, 2)
    pid = np.stack([straggler[waits].astype(np.int64) + 1, rank + 1], axis=1).ravel()
    ends = np.tile(np.array(['"ph":"s"', '"ph":"f","bp":"e"'], object), len(rank))
    return _join('{"name":"waits for","cat":"straggler","id":"', _text(np.repeat(step, 2)),
                 "-", _text(np.repeat(rank, 2)), '","tid":0,"ts":', _us(ts), ",",
                 _text(ends), ',"pid":', _text(pid), "}")


def _counters_json(rows: Any, changed: dict[str, np.ndarray], origin: int) -> Any:
    """A counter event where a worker's slice size or resident memory (MiB) changed: per
    row the slice, then the memory."""
    import pyarrow as pa

    n = len(rows)
    tenths = changed["rss_tenths"]
    values = pa.concat_arrays([_join(_text(rows["batch_size"].to_numpy(np.int64)), ".0"),
                               _join(_text(tenths // 10), ".", _text(tenths % 10))])
    keep = np.stack([changed["slice"], changed["rss"]], axis=1).ravel()
    order = np.stack([np.arange(n), np.arange(n) + n], axis=1).ravel()[keep]
    names = np.tile(np.array(["slice (samples)", "rss (MiB)"], object), n)[keep]
    pid = np.repeat(rows["rank"].to_numpy(np.int64) + 1, 2)[keep]
    ts = np.repeat(rows["begin_ns"].to_numpy(np.int64) - origin, 2)[keep]
    return _join('{"ph":"C","name":"', _text(names), '","pid":', _text(pid),
                 ',"tid":0,"ts":', _us(ts), ',"args":{"value":', values.take(pa.array(order)),
                 "}}")


def _write_events(out: Any, events: Any) -> None:
    """Each event after ',\\n', written straight from the string array's buffer."""
    if not len(events):
        return
    lines = _join(",\n", events)
    offsets = np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1, lines.offset * 4)
    out.write(memoryview(lines.buffers()[2])[offsets[0]:offsets[-1]])
