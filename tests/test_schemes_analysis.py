"""Synchronisation schemes in the analysis (analysis/tables/schemes.py, analysis/view/metrics.py):
staleness, idle under asynchronous steps, hardware against statistical efficiency, the
report's section and figures, from records built by hand with known answers. And the
noisy worker the `sync` suite emulates (`jitter`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.render import report
from hetbench.analysis.render.figures import write_all
from hetbench.analysis.render.terminal import render
from hetbench.analysis.tables.schemes import (
    scheme_groups,
    scheme_table,
    staleness_bound,
    staleness_counts,
    staleness_summary,
)
from hetbench.analysis.view.metrics import run_summary, with_derived
from hetbench.harness.records import collector
from hetbench.harness.records.collector import RECORD_DTYPE
from hetbench.harness.records.results import Run
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import parse_suite, run_from_dict
from tests.synthetic import MS, steps_frame

GLOBAL_BATCH = 64


def asynchronous_steps(staleness: list[list[int]], wait_ms: float = 1.0,
                       dropped: set[tuple[int, int]] = frozenset()) -> pd.DataFrame:
    """Two workers of 32 samples, worker 1 twice as slow; staleness[rank][step]; every
    exchange waits wait_ms between a 0.5 ms push and a 0.5 ms pull."""
    rows = []
    for rank, values in enumerate(staleness):
        compute = (rank + 1) * 2 * MS
        exchange = int((1.0 + wait_ms) * MS)
        period = compute + exchange + MS // 10
        for step, value in enumerate(values):
            row = np.zeros(1, dtype=RECORD_DTYPE)[0]
            begin = step * period
            row["rank"], row["step"], row["batch_size"] = rank, step, 32
            row["begin_ns"], row["ready_ns"] = begin, begin + compute
            row["reduced_ns"] = begin + compute + exchange
            row["end_ns"] = begin + period
            row["forward_ns"], row["backward_ns"] = compute // 2, compute - compute // 2
            row["allreduce_ns"], row["apply_ns"] = exchange, MS // 10
            row["compute_cpu_ns"], row["loss"], row["local_loss"] = compute, 1.0, 1.0
            row["staleness"], row["push_ns"], row["pull_ns"] = value, MS // 2, MS // 2
            row["wait_ns"], row["asynchronous"] = int(wait_ms * MS), True
            row["dropped"] = (rank, step) in dropped
            rows.append(row)
    return collector.records_frame([np.array(rows, dtype=RECORD_DTYPE)])


def manifest(name: str, repeat: int, aggregator: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": f"{name}-r{repeat}", "repeat": repeat, "status": "completed",
            "suite": {"name": "sync"}, "heterogeneity": "emulated",
            "run": {"name": name, "workload": "cnn", "steps": 4, "warmup_steps": 0,
                    "global_batch": GLOBAL_BATCH, "aggregator": aggregator,
                    "target": {"metric": "accuracy", "value": 0.5},
                    "workers": [{"device": "cpu"}, {"device": "cpu", "slowdown": 2.0}]}}


def evals(accuracy: list[float], seconds_per_eval: float) -> pd.DataFrame:
    steps = [2 * i for i in range(len(accuracy))]
    return pd.DataFrame({"step": steps, "train_s": [seconds_per_eval * i for i in
                                                    range(len(steps))],
                         "wall_s": [seconds_per_eval * i for i in range(len(steps))],
                         "loss": [1.0] * len(steps), "accuracy": accuracy})


def test_staleness_bound_per_scheme() -> None:
    assert staleness_bound({"aggregator": {"name": "ssp", "staleness": 3}}) == 3
    assert staleness_bound({"aggregator": {"name": "local-sgd", "local_steps": 4}}) == 3
    assert staleness_bound({"aggregator": {"name": "ps-async"}}) == math.inf
    for name in ("torch", "ps-sync", "backup"):
        assert staleness_bound({"aggregator": {"name": name}}) == 0
    assert staleness_bound({"strategy": "mxnet-kvstore"}) == 0  # recorded before aggregators


def test_idle_of_asynchronous_steps_is_the_measured_wait() -> None:
    steps = asynchronous_steps([[0, 1, 0, 2], [1, 0, 3, 1]], wait_ms=1.5)
    derived = with_derived(steps)
    assert (derived["idle_ns"] == 1.5 * MS).all()  # not arrival - ready
    assert (derived["comm_ns"] == MS).all()  # push + pull
    # synchronous rows keep the arrival-based definition
    synchronous = with_derived(steps_frame(3, lambda r, s: [2.0, 5.0][r]))
    assert synchronous.loc[synchronous["rank"] == 0, "idle_ns"].eq(3 * MS).all()


def test_asynchronous_throughput_counts_only_samples_that_became_updates() -> None:
    steps = asynchronous_steps([[0] * 4, [0] * 4], dropped={(1, 3)})
    summary = run_summary(steps)
    wall_s = (steps["end_ns"].max() - steps["begin_ns"].min()) / 1e9
    assert summary["samples_per_s"] == pytest.approx(7 * 32 / wall_s)
    # wall time per global batch (64 samples) of them
    assert summary["mean_step_ms"] == pytest.approx(wall_s * 1e3 * 64 / (7 * 32))
    busy = (steps["end_ns"] - steps["begin_ns"]).sum()
    assert summary["idle_fraction"] == pytest.approx(8 * MS / busy)


def test_staleness_counts_and_summary_pool_the_repeats_updates() -> None:
    runs = [Run.of(manifest("ssp", 0, {"name": "ssp", "staleness": 2}),
                   asynchronous_steps([[0, 1, 1, 2], [0, 0, 3, 1]], dropped={(0, 3)})),
            Run.of(manifest("ssp", 1, {"name": "ssp", "staleness": 2}),
                   asynchronous_steps([[0, 0, 0, 0], [1, 1, 1, 1]])),
            Run.of(manifest("bsp", 0, {"name": "torch"}), steps_frame(4, lambda r, s: 1.0))]
    counts = staleness_counts(runs)
    first = counts[(counts["run"] == "ssp") & (counts["repeat"] == 0)]
    # the dropped update (staleness 2) is not an update
    assert dict(zip(first["staleness"], first["updates"], strict=True)) == {0: 3, 1: 3, 3: 1}
    summary = staleness_summary(counts).set_index("run")
    values = np.array([0, 1, 1, 0, 0, 3, 1, 0, 0, 0, 0, 1, 1, 1, 1])
    assert summary.loc["ssp", "updates"] == len(values)
    assert summary.loc["ssp", "mean"] == pytest.approx(values.mean())
    assert summary.loc["ssp", "p90"] == pytest.approx(np.percentile(values, 90))
    assert summary.loc["ssp", "max"] == 3
    assert summary.loc["ssp", "stale_share"] == pytest.approx((values > 0).mean())
    assert summary.loc["bsp", "max"] == 0 and summary.loc["bsp", "stale_share"] == 0


def scheme_runs() -> list[Run]:
    runs = []
    for repeat in range(2):
        for name, aggregator, steps, seconds in (
                ("bsp", {"name": "torch"}, steps_frame(4, lambda r, s: [2.0, 4.0][r]), 2.0),
                ("async", {"name": "ps-async"},
                 asynchronous_steps([[0, 1, 2, 1], [2, 3, 2, 2]]), 1.0 + repeat)):
            runs.append(Run.of(manifest(name, repeat, aggregator), steps,
                               evals=evals([0.1, 0.3, 0.6, 0.7], seconds)))
    return runs


def test_scheme_table_puts_hardware_beside_statistical_efficiency() -> None:
    runs = scheme_runs()
    table = scheme_table(runs).set_index("run_id")
    assert table.loc["async-r0", "bound"] == math.inf and table.loc["bsp-r1", "bound"] == 0
    assert table.loc["async-r0", "staleness_mean"] == pytest.approx(13 / 8)
    assert table.loc["bsp-r0", "staleness_mean"] == 0
    # the target (accuracy 0.5) is first reached at the third evaluation: step 4
    assert table.loc["async-r1", "steps_to_target"] == 4
    assert table.loc["async-r1", "time_to_target_s"] == pytest.approx(4.0)
    assert table.loc["bsp-r0", "time_to_target_s"] == pytest.approx(4.0)
    assert table.loc["async-r0", "idle_fraction"] < table.loc["bsp-r0", "idle_fraction"]
    groups = scheme_groups(scheme_table(runs))
    row = groups[(groups["run"] == "async") & (groups["metric"] == "time_to_target_s")].iloc[0]
    assert row["mean"] == pytest.approx(3.0) and row["n"] == 2  # 2 s and 4 s
    assert row["reached"] == 2 and row["repeats"] == 2


def test_report_and_figures_compare_the_schemes(tmp_path: Path) -> None:
    runs = scheme_runs()
    markdown, summary = report.build(runs)
    section = markdown.split("## Synchronisation schemes")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[2].startswith("| bsp | torch | 0 | 2/2 |")  # in the runs' order
    assert rows[3].startswith("| async | ps-async | inf | 2/2 |")
    assert "### Staleness of the updates" in section
    assert "Synchronisation schemes" in render(summary)
    names = {p.name for p in write_all(runs, tmp_path)}
    assert {"tradeoff.png", "tradeoff.pdf", "staleness.png"} <= names
    # all-reduce runs alone get no schemes section
    only_bsp = [r for r in runs if r.name == "bsp"]
    assert "Synchronisation schemes" not in report.build(only_bsp)[0]


# -- the noisy worker ----------------------------------------------------------------------


def worker(jitter: Any) -> Any:
    return parse_suite({"runs": [{"name": "r", "workers": [{}, {"jitter": jitter}]}]}
                       ).runs[0].workers[1]


def test_jitter_slows_a_seeded_fraction_of_the_steps() -> None:
    noisy = worker({"probability": 0.2, "factor": 4.0})
    assert noisy.jitter == (0.2, 4.0) and noisy.emulated and noisy.varies
    factors = [noisy.factor_at(s, seed=0, rank=1) for s in range(5000)]
    assert set(factors) == {1.0, 4.0}
    assert 0.18 < factors.count(4.0) / len(factors) < 0.22
    assert factors == [noisy.factor_at(s, seed=0, rank=1) for s in range(5000)]  # repeatable
    assert factors != [noisy.factor_at(s, seed=1, rank=1) for s in range(5000)]
    # on top of a fixed slowdown
    both = parse_suite({"runs": [{"name": "r", "workers": [
        {"slowdown": 2.0, "jitter": {"probability": 1.0, "factor": 1.5}}]}]}).runs[0]
    assert both.workers[0].factor_at(7, seed=0, rank=0) == 3.0
    assert run_from_dict(both.to_dict()).workers[0] == both.workers[0]


@pytest.mark.parametrize(("jitter", "where", "message"), [
    ({"probability": 1.5, "factor": 2.0}, "probability", "1.5 is not allowed (0 to 1)"),
    ({"probability": 0.5, "factor": 0.5}, "factor", "0.5 is not allowed (must be at least 1.0)"),
    ({"factor": 2.0}, "probability", "required"),
    ({"probability": 0.5, "factor": 2.0, "seed": 1}, "seed", "unknown key"),
])
def test_bad_jitter_names_the_field(jitter: dict[str, Any], where: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        worker(jitter)
    assert info.value.where == f"runs[0].workers[1].jitter.{where}"
    assert message in info.value.message
