"""A check of trace.json against the Trace Event Format (the Chrome/Perfetto JSON format),
written apart from hetbench.harness.records.collector so that it is not the writer checking itself:
event types, units (microseconds, as float), process ids from 1, the nesting of each step's
phases in its parent slice, and flows that pair up."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd

TYPES = {"M", "X", "C", "s", "f"}


def check_trace(path: Path, steps: pd.DataFrame | None = None) -> dict[str, Any]:
    """Assert the trace is well formed; with `steps` (the run's steps.parquet), that its
    step slices are the computing rows, at their times. Returns the events by type."""
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] in ("ms", "ns")
    events = data["traceEvents"]
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        assert e["ph"] in TYPES, e
        assert isinstance(e["pid"], int) and e["pid"] >= 1, e
        assert isinstance(e["tid"], int), e
        by_type[e["ph"]].append(e)
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and e["ts"] >= 0 and math.isfinite(e["ts"]), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], float) and e["dur"] >= 0, e
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values()), e
    names = {e["pid"]: e["args"]["name"] for e in by_type["M"] if e["name"] == "process_name"}
    assert all(names[pid].startswith(f"worker {pid - 1} (") for pid in names), names
    assert {e["pid"] for e in events} <= set(names)
    # nesting: the phases of a (worker, step) lie in its parent slice and tile it
    parents, children = {}, defaultdict(list)
    for e in by_type["X"]:
        key = (e["pid"], e["args"]["step"])
        if e["cat"] == "step":
            assert key not in parents, key
            parents[key] = e
        else:
            children[key].append(e)
    assert set(children) <= set(parents)  # a step of a run with instrument = false: none
    for key, parts in children.items():
        parent, tolerance = parents[key], 1e-3  # a nanosecond, in microseconds
        parts.sort(key=lambda e: e["ts"])
        assert abs(parts[0]["ts"] - parent["ts"]) <= tolerance, key
        for a, b in zip(parts, parts[1:], strict=False):
            assert abs(a["ts"] + a["dur"] - b["ts"]) <= tolerance, key
        end = parts[-1]["ts"] + parts[-1]["dur"]
        assert abs(end - (parent["ts"] + parent["dur"])) <= tolerance, key
    # flows: every start has its finish, at the same instant, on another worker
    starts = {e["id"]: e for e in by_type["s"]}
    finishes = {e["id"]: e for e in by_type["f"]}
    assert set(starts) == set(finishes)
    for flow_id, s in starts.items():
        f = finishes[flow_id]
        assert s["pid"] != f["pid"] and abs(s["ts"] - f["ts"]) <= 1e-3 and f["bp"] == "e"
    if steps is not None:
        computing = steps[steps["batch_size"] > 0]
        assert len(parents) == len(computing)
        origin = computing["begin_ns"].min()
        for row in computing.itertuples(index=False):
            parent = parents[(row.rank + 1, row.step)]
            assert abs(parent["ts"] - (row.begin_ns - origin) / 1000) <= 1e-3
            assert abs(parent["dur"] - (row.end_ns - row.begin_ns) / 1000) <= 1e-3
    return by_type
