"""Recording one step in the worker loop: counters (getrusage, sampled RSS, gc time) plus
the record appended to the part file (flushed every 16 steps, as in a run)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hetbench.harness.loop.counters import Counters
from hetbench.harness.records.collector import RECORD_FIELDS, RecordWriter

COUNTER_FIELDS = 7  # the tail of a record that Counters.take() returns


@pytest.fixture
def counters() -> Iterator[Counters]:
    c = Counters()
    yield c
    gc.callbacks.remove(c.gc._callback)  # the timer must not outlive the benchmark


def test_record_step(benchmark: Any, tmp_path: Path, counters: Counters) -> None:
    writer = RecordWriter(tmp_path / "rank0.bin")
    head = tuple(0 for _ in RECORD_FIELDS[:-COUNTER_FIELDS])

    def record() -> None:
        writer.append((*head, *counters.take()))

    benchmark.group = "record"
    benchmark(record)
    writer.close()
    assert (tmp_path / "rank0.bin").stat().st_size > 0


def test_counters_take(benchmark: Any, counters: Counters) -> None:
    benchmark.group = "record"
    benchmark(counters.take)


def test_record_writer_append(benchmark: Any, tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "rank0.bin")
    record = tuple(0 for _ in RECORD_FIELDS)
    benchmark.group = "record"
    benchmark(writer.append, record)
    writer.close()
