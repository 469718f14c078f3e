from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.view.metrics import run_summary, with_derived, worker_summary
from hetbench.harness.records import collector
from hetbench.harness.records import trace as trace_writer
from hetbench.harness.records.collector import PHASES, RECORD_DTYPE, RECORD_FIELDS, RecordWriter
from tests.trace_check import check_trace


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


class Stopped(Exception):
    pass


def test_a_stop_signal_during_a_flush_writes_no_row_twice(tmp_path: Path, monkeypatch) -> None:
    """The workers' SIGINT handler raises wherever it lands; the writer's close() then flushes
    whatever is still pending. A signal arriving just as the rows reach the file must not leave
    them pending (seen once: a ctrl-c'd run with one step twice in steps.parquet). The signal
    goes to another thread, as the kernel may pick any of a worker's threads (gloo's, the
    loader's); Python runs the handler in the main thread all the same."""
    def raise_stopped(signum: int, frame: Any) -> None:
        raise Stopped

    real_write = os.pwrite
    leave = threading.Event()
    bystander = threading.Thread(target=leave.wait, args=(10,))
    bystander.start()

    def write_then_signal(fd: int, data: bytes, offset: int) -> int:
        written = real_write(fd, data, offset)
        assert bystander.ident is not None
        signal.pthread_kill(bystander.ident, signal.SIGINT)
        time.sleep(0.05)  # the bystander takes it; the main thread's next line runs the handler
        return written

    previous = signal.signal(signal.SIGINT, raise_stopped)
    path = collector.part_path(tmp_path, 0)
    writer = RecordWriter(path, flush_every=2)
    try:
        monkeypatch.setattr(collector.os, "pwrite", write_then_signal)
        try:
            for step in range(4):
                writer.append(record(0, step, 1000 * step, 1000 * step + 500, 1000 * step + 900))
        except Stopped:
            pass
        monkeypatch.setattr(collector.os, "pwrite", real_write)
    finally:
        writer.close()
        signal.signal(signal.SIGINT, previous)
        leave.set()
        bystander.join(10)
    assert collector.read_part(path)["step"].tolist() == [0, 1]
    assert writer.records()["step"].tolist() == [0, 1]


def finalize(run_dir: Path, arrays: list[np.ndarray], labels: list[str],
             last_steps: int | None = None) -> int:
    """What closing a run writes of its records: steps.parquet, then the trace."""
    frame = collector.write_records(run_dir, arrays)
    trace_writer.write_trace(run_dir, frame, labels, last_steps)
    return len(frame)


def test_finalize_writes_parquet_and_a_chrome_trace(tmp_path: Path) -> None:
    arrays = [np.array([record(r, s, 1000 * s, 1000 * s + 300 + 200 * r, 1000 * s + 900)
                        for s in range(3)], dtype=RECORD_DTYPE) for r in range(2)]
    rows = finalize(tmp_path, arrays, ["fast", "slow"])
    assert rows == 6
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    events = check_trace(tmp_path / "trace.json", pd.read_parquet(tmp_path / "steps.parquet"))
    names = {e["args"]["name"] for e in trace if e["ph"] == "M"}
    assert names == {"worker 0 (fast)", "worker 1 (slow)"}
    slices = [e for e in trace if e["ph"] == "X" and e["cat"] == "phase"]
    assert len(slices) == 6 * (len(PHASES) + 1)  # the exchange as idle, then all-reduce
    assert {e["pid"] for e in slices} == {1, 2}  # pid = rank + 1
    steps = [e for e in trace if e["ph"] == "X" and e["cat"] == "step"]
    assert sorted(e["name"] for e in steps) == ["step 0", "step 0", "step 1", "step 1",
                                                "step 2", "step 2"]
    # idle is the wait for the last worker's gradients: worker 1 is ready 200 ns after
    # worker 0 at every step, and waits for no one
    idle = {(e["pid"], e["args"]["step"]): e["dur"] for e in slices if e["name"] == "idle"}
    assert set(idle.values()) == {0.2, 0.0} and idle[(1, 1)] == 0.2 and idle[(2, 1)] == 0.0
    # each row's slices tile it from begin to end, in order
    row = [e for e in slices if e["pid"] == 1 and e["args"]["step"] == 2]
    assert [e["name"] for e in row] == ["load", "to_device", "forward", "backward", "pack",
                                        "idle", "allreduce", "unpack", "apply"]
    assert all(a["ts"] + a["dur"] == b["ts"] for a, b in zip(row, row[1:], strict=False))
    assert row[-1]["ts"] + row[-1]["dur"] == 2.9  # end_ns 2900, origin 0
    # one arrow a step from the straggler (worker 1) to worker 0, where its all-reduce
    # starts (after its idle)
    assert [(s["pid"], s["ts"]) for s in events["s"]] == [(2, 0.5), (2, 1.5), (2, 2.5)]
    allreduce = {e["args"]["step"]: e["ts"] for e in slices
                 if e["pid"] == 1 and e["name"] == "allreduce"}
    assert [(f["pid"], f["ts"]) for f in events["f"]] == [(1, allreduce[s]) for s in range(3)]
    # the slice size as a counter: one event per worker (it never changed); no rss recorded
    assert [(c["pid"], c["name"], c["args"]["value"]) for c in events["C"]] == [
        (1, "slice (samples)", 8.0), (2, "slice (samples)", 8.0)]


def test_the_trace_is_written_in_chunks_and_splits_an_asynchronous_exchange(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trace_writer, "CHUNK_ROWS", 2)  # 5 rows: three chunks
    rows = [record(0, s, 1000 * s, 1000 * s + 300, 1000 * s + 900) for s in range(5)]
    array = np.array(rows, dtype=RECORD_DTYPE)
    array["asynchronous"], array["push_ns"], array["wait_ns"] = True, 100, 250
    finalize(tmp_path, [array], ["alone"])
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    check_trace(tmp_path / "trace.json", pd.read_parquet(tmp_path / "steps.parquet"))
    names = [e["name"] for e in trace if e["ph"] == "X" and e["args"]["step"] == 4]
    assert names == ["step 4", "load", "to_device", "forward", "backward", "pack", "push",
                     "wait", "pull", "unpack", "apply"]
    pull = next(e for e in trace if e.get("name") == "pull" and e["args"]["step"] == 4)
    assert pull["dur"] == (590 - 100 - 250) / 1000  # the exchange 590 ns: ready to reduced
    assert len([e for e in trace if e["ph"] == "X"]) == 5 * 11
    assert not [e for e in trace if e["ph"] in "sf"]  # no one waits for anyone alone


def test_a_step_of_a_run_with_instrument_false_is_its_parent_slice_alone(tmp_path: Path) -> None:
    array = np.array([record(r, s, 1000 * s, 0, 1000 * s + 900) for s in range(3)
                      for r in range(2)], dtype=RECORD_DTYPE)
    array["forward_ns"] = array["allreduce_ns"] = array["apply_ns"] = 0  # nothing timed
    finalize(tmp_path, [array], ["a", "b"])
    events = check_trace(tmp_path / "trace.json", pd.read_parquet(tmp_path / "steps.parquet"))
    assert [e["name"] for e in events["X"] if e["pid"] == 1] == ["step 0", "step 1", "step 2"]
    assert all(e["dur"] == 0.9 for e in events["X"]) and not events["s"]


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


def test_the_trace_holds_the_last_trace_steps_steps_or_none(tmp_path: Path) -> None:
    """A 1M-record run's trace of every step took minutes and 1.2 GB (issue 30)."""
    arrays = [np.array([record(r, s, 1000 * s, 1000 * s + 300, 1000 * s + 900)
                        for s in range(10)], dtype=RECORD_DTYPE) for r in range(2)]
    assert finalize(tmp_path, arrays, ["a", "b"], last_steps=3) == 20
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    steps = sorted({e["args"]["step"] for e in trace if e["ph"] == "X"})
    assert steps == [7, 8, 9]
    assert len(pd.read_parquet(tmp_path / "steps.parquet")) == 20  # the records: all
    (tmp_path / "trace.json").unlink()
    finalize(tmp_path, arrays, ["a", "b"], last_steps=0)
    assert not (tmp_path / "trace.json").exists()


def test_a_trace_window_holds_its_steps_and_at_most_max_rows(tmp_path: Path,
                                                            monkeypatch) -> None:
    """`trace_steps = "2-4"` holds steps 2 to 4; any window keeps the last whole steps
    that fit in MAX_ROWS rows (a trace Perfetto's UI can load)."""
    arrays = [np.array([record(r, s, 1000 * s, 1000 * s + 300, 1000 * s + 900)
                        for s in range(10)], dtype=RECORD_DTYPE) for r in range(2)]

    def traced_steps(window: Any) -> list[int]:
        finalize(tmp_path, arrays, ["a", "b"], last_steps=window)
        events = check_trace(tmp_path / "trace.json")
        return sorted({e["args"]["step"] for e in events["X"]})

    assert traced_steps((2, 4)) == [2, 3, 4]
    monkeypatch.setattr(trace_writer, "MAX_ROWS", 5)  # two rows a step: the last 2 steps
    assert traced_steps(None) == [8, 9]
    assert traced_steps((2, 6)) == [5, 6]


def test_counters_flows_and_idle_are_where_the_records_put_them(tmp_path: Path) -> None:
    """The trace's counters, flows and idle, read back, against values known by
    construction (tests/trace_check.py checks the format): a lockstep pair whose slices
    and memory change once, its second worker late at odd steps."""
    rows = [record(r, s, 1000 * s, 1000 * s + 300 + 50 * r * (s % 2), 1000 * s + 900)
            for s in range(6) for r in range(2)]
    array = np.array(rows, dtype=RECORD_DTYPE)
    array["batch_size"] = [8 if s < 3 else 12 for s in range(6) for _ in range(2)]
    array["rss_bytes"] = [(100 + (s > 2)) << 20 for s in range(6) for _ in range(2)]
    finalize(tmp_path, [array[array["rank"] == r] for r in range(2)], ["a", "b"])
    events = check_trace(tmp_path / "trace.json",
                         pd.read_parquet(tmp_path / "steps.parquet"))
    counters = [(c["pid"], c["name"], c["args"]["value"], c["ts"]) for c in events["C"]]
    assert counters == [
        (1, "slice (samples)", 8.0, 0.0), (1, "rss (MiB)", 100.0, 0.0),
        (2, "slice (samples)", 8.0, 0.0), (2, "rss (MiB)", 100.0, 0.0),
        (1, "slice (samples)", 12.0, 3.0), (1, "rss (MiB)", 101.0, 3.0),
        (2, "slice (samples)", 12.0, 3.0), (2, "rss (MiB)", 101.0, 3.0)]
    # worker 1 is ready 50 ns later at odd steps: worker 0 waits for it there; at even
    # steps both are ready at once and the first (worker 0) counts as the last
    flows = [(s["id"], s["pid"], f["pid"], s["ts"]) for s, f in zip(events["s"], events["f"],
                                                                      strict=True)]
    assert flows == [("0-1", 1, 2, 0.3), ("1-0", 2, 1, 1.35), ("2-1", 1, 2, 2.3),
                     ("3-0", 2, 1, 3.35), ("4-1", 1, 2, 4.3), ("5-0", 2, 1, 5.35)]
    idle = {e["args"]["step"]: e["dur"] for e in events["X"]
            if e["name"] == "idle" and e["pid"] == 1}
    assert idle == {0: 0.0, 1: 0.05, 2: 0.0, 3: 0.05, 4: 0.0, 5: 0.05}


def test_the_writer_lays_rows_out_as_numpy_does_whatever_values_they_hold(tmp_path: Path
                                                                          ) -> None:
    """Rows are packed by struct, not numpy (faster): the bytes must be numpy's for every
    table's dtype, also for numpy scalars, NaN, negatives and extremes; a value struct
    refuses (a float in an integer field) falls back to numpy's conversion."""
    rng = np.random.default_rng(3)
    for dtype in (RECORD_DTYPE, collector.MICRO_DTYPE, collector.BUCKET_DTYPE):
        packer = collector.row_packer(dtype)
        assert packer is not None, dtype
        rows = []
        for i in range(40):
            row: list[Any] = []
            for name in dtype.names or ():
                kind, size = dtype[name].kind, dtype[name].itemsize
                if kind == "b":
                    row.append([True, False, np.bool_(True)][i % 3])
                elif kind == "f":
                    row.append([float("nan"), -1.5, np.float64(rng.normal()), 1e300][i % 4])
                else:
                    top = np.iinfo(f"i{size}").max
                    row.append([-1, top, -top - 1, np.int64(rng.integers(0, 2**30)),
                                int(rng.integers(-2**31, 2**31))][i % 5])
            rows.append(tuple(row))
        path = tmp_path / f"{dtype.itemsize}.bin"
        writer = RecordWriter(path, flush_every=7, dtype=dtype)
        for row in rows:
            writer.append(row)
        writer.close()
        as_numpy = np.array(rows, dtype=dtype).tobytes()
        assert b"".join(packer.pack(*row) for row in rows) == as_numpy  # no fallback
        assert path.read_bytes() == as_numpy
    with_float = tuple(2.7 if RECORD_DTYPE[f].kind == "i" else 0 for f in RECORD_FIELDS)
    writer = RecordWriter(tmp_path / "float.bin")
    writer.append(with_float)
    writer.close()
    assert (tmp_path / "float.bin").read_bytes() == \
        np.array([with_float], dtype=RECORD_DTYPE).tobytes()


def test_a_step_records_fields_are_declared_once() -> None:
    """The dtype, the reference's descriptions and older runs' defaults all come from
    hetbench.harness.records.fields: every field has its type, writer and meaning there."""
    from hetbench.harness.records import fields

    assert RECORD_FIELDS == fields.NAMES
    assert [RECORD_DTYPE[f.name].str for f in fields.STEP_FIELDS] == \
        [np.dtype(f.dtype).str for f in fields.STEP_FIELDS]
    assert all(f.description and f.writer in fields.WRITERS for f in fields.STEP_FIELDS)
    # the exchange's fields read as an all-reduce step's in runs recorded before them
    assert {n: fields.OLDER[n] for n in fields.written_by("exchange")} == {
        "staleness": 0, "push_ns": 0, "wait_ns": 0, "pull_ns": 0, "asynchronous": False,
        "dropped": False}
    # the fields that may hold UNMEASURED: sampled, or not counted on the worker's host
    assert set(fields.SAMPLED) == {*fields.written_by("cpu"), "ctx_voluntary",
                                   "ctx_involuntary", "cpu_user_ns", "cpu_system_ns"}
