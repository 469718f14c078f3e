from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analysis.metrics import run_summary, with_derived, worker_summary
from harness import collector
from harness.collector import PHASES, RECORD_DTYPE, RECORD_FIELDS, RecordWriter


def record(rank: int, step: int, begin: int, ready: int, end: int, batch: int = 8) -> tuple:
    values = dict.fromkeys(RECORD_FIELDS, 0)
    values.update(rank=rank, step=step, batch_size=batch, begin_ns=begin, ready_ns=ready,
                  reduced_ns=end - 10, end_ns=end, loss=1.0, local_loss=1.0)
    values["forward_ns"] = ready - begin
    values["allreduce_ns"] = end - 10 - ready
    values["apply_ns"] = 10
    return tuple(values[f] for f in RECORD_FIELDS)


def test_torn_last_row_is_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    path = collector.part_path(tmp_path, 0)
    writer = RecordWriter(path, flush_every=2)
    for step in range(5):
        writer.append(record(0, step, 1000 * step, 1000 * step + 500, 1000 * step + 900))
    writer.close()
    with open(path, "ab") as f:  # a crash in the middle of writing the next row
        f.write(b"\x01" * (RECORD_DTYPE.itemsize // 2))
    rows = collector.read_part(path)
    assert rows["step"].tolist() == [0, 1, 2, 3, 4]
    assert collector.steps_done(tmp_path, 1) == 5


def test_finalize_writes_parquet_and_a_chrome_trace(tmp_path: Path) -> None:
    arrays = [np.array([record(r, s, 1000 * s, 1000 * s + 300 + 200 * r, 1000 * s + 900)
                        for s in range(3)], dtype=RECORD_DTYPE) for r in range(2)]
    rows = collector.finalize(tmp_path, arrays, ["fast", "slow"])
    assert rows == 6
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in trace if e["ph"] == "M"}
    assert names == {"worker 0 (fast)", "worker 1 (slow)"}
    slices = [e for e in trace if e["ph"] == "X"]
    assert len(slices) == 6 * len(PHASES)
    assert {e["pid"] for e in slices} == {0, 1}


def test_idle_before_allreduce_follows_the_design_definition(tmp_path: Path) -> None:
    arrays = [np.array([record(0, 0, 0, 300, 1000), record(0, 1, 1000, 1400, 2000)],
                       dtype=RECORD_DTYPE),
              np.array([record(1, 0, 0, 700, 1000), record(1, 1, 1000, 1200, 2000)],
                       dtype=RECORD_DTYPE)]
    frame = collector.records_frame(arrays)
    derived = with_derived(frame).set_index(["step", "rank"])
    assert derived.loc[(0, 0), "idle_ns"] == 400 and derived.loc[(0, 1), "idle_ns"] == 0
    assert derived.loc[(1, 1), "idle_ns"] == 200 and derived.loc[(1, 0), "idle_ns"] == 0
    assert derived.loc[(0, 0), "comm_ns"] == 1000 - 10 - 700
    summary = run_summary(frame)
    assert summary["idle_fraction"] == (400 + 200) / 4000
    # compute 300 + 700 + 400 + 200 ns; communication after the last arrival (700 and 1400)
    assert summary["compute_share"] == (300 + 700 + 400 + 200) / 4000
    assert summary["comm_share"] == 2 * ((1000 - 10 - 700) + (2000 - 10 - 1400)) / 4000
    assert summary["samples_per_s"] == 32 / 2000e-9
    workers = worker_summary(frame).set_index("rank")
    assert workers.loc[0, "compute_mean_ms"] == (300 + 400) / 2 / 1e6
