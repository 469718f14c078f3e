"""Analysis of one million step records (250,000 steps of 4 workers), generated in numpy
with the collector's record layout: the whole per-run analysis a report computes (issue 3's
target: at most 5 s here), the per-row derivation and the two summaries every report and
comparison starts from, and compare's per-run metrics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.tables.compare import run_metrics
from hetbench.analysis.tables.runs import analyse_run
from hetbench.analysis.view.metrics import run_summary, with_derived, worker_summary
from hetbench.harness.records.collector import PHASES, RECORD_DTYPE

ROWS, WORKERS = 1_000_000, 4


@pytest.fixture(scope="module")
def steps() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n_steps = ROWS // WORKERS
    compute = rng.lognormal(np.log(1e6), 0.1, (n_steps, WORKERS)).astype(np.int64)
    comm, tail = 300_000, 100_000
    ready_offset = compute
    step_len = compute.max(axis=1) + comm + tail
    begin = np.concatenate([[0], np.cumsum(step_len)[:-1]])
    records = np.zeros((n_steps, WORKERS), dtype=RECORD_DTYPE)
    records["rank"] = np.arange(WORKERS)
    records["step"] = np.arange(n_steps)[:, None]
    records["batch_size"] = 32
    records["begin_ns"] = begin[:, None]
    records["ready_ns"] = begin[:, None] + ready_offset
    arrival = records["ready_ns"].max(axis=1, keepdims=True)
    records["reduced_ns"] = arrival + comm
    records["end_ns"] = arrival + comm + tail
    compute_phases = PHASES[: PHASES.index(PHASES[4]) + 1]
    for phase in compute_phases:
        records[f"{phase.value}_ns"] = compute // len(compute_phases)
    records["allreduce_ns"] = arrival + comm - records["ready_ns"]
    records["apply_ns"] = tail
    # System counters with the shapes the attribution reads: rare involuntary switches and
    # GC pauses, CPU time slightly under wall time, a slowly growing RSS.
    records["compute_cpu_ns"] = (compute * rng.uniform(0.85, 1.0, compute.shape)).astype(np.int64)
    records["ctx_involuntary"] = rng.poisson(0.2, compute.shape)
    records["ctx_voluntary"] = rng.poisson(3, compute.shape)
    records["gc_collections"] = rng.random(compute.shape) < 0.01
    records["gc_ns"] = records["gc_collections"] * rng.integers(50_000, 500_000, compute.shape)
    records["cpu_user_ns"] = np.cumsum(compute, axis=0)
    records["rss_bytes"] = 200_000_000 + np.arange(n_steps)[:, None] * 16
    records["loss"] = 2.3
    frame = pd.DataFrame(records.reshape(-1))
    assert len(frame) == ROWS
    return frame


def test_full_analysis(benchmark: Any, steps: pd.DataFrame) -> None:
    """Everything `hetbench report` computes for one run: metrics, phase statistics, idle,
    stragglers and their causes, autocorrelation, change points, what-if."""
    benchmark.group = "analysis of 1M records"
    tables = benchmark.pedantic(analyse_run, (steps, 10), rounds=3, iterations=1)
    assert len(tables["workers"]) == WORKERS
    assert tables["attribution"]["step"].nunique() > 0


def test_with_derived(benchmark: Any, steps: pd.DataFrame) -> None:
    benchmark.group = "analysis of 1M records"
    benchmark(with_derived, steps)


def test_run_summary(benchmark: Any, steps: pd.DataFrame) -> None:
    benchmark.group = "analysis of 1M records"
    summary = benchmark(run_summary, steps, 10)
    assert summary["steps"] == ROWS // WORKERS - 10


def test_worker_summary(benchmark: Any, steps: pd.DataFrame) -> None:
    benchmark.group = "analysis of 1M records"
    workers = benchmark(worker_summary, steps, 10)
    assert len(workers) == WORKERS


def test_all_three(benchmark: Any, steps: pd.DataFrame) -> None:
    """What a report of one run computes: derived columns and both summaries."""

    def analyse() -> None:
        with_derived(steps)
        run_summary(steps, 10)
        worker_summary(steps, 10)

    benchmark.group = "analysis of 1M records"
    benchmark(analyse)


def test_compare_run_metrics(benchmark: Any, steps: pd.DataFrame) -> None:
    benchmark.group = "analysis of 1M records"
    values = benchmark(run_metrics, steps, 10)
    assert len(values) == 3 + WORKERS * (2 + len(PHASES))
