"""The metric registry: every consumer reads the same values, and a compared metric says
which way is better."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.tables import registry
from hetbench.analysis.tables.compare import RUN_LEVEL, run_metrics
from hetbench.analysis.tables.runs import runs_table
from hetbench.harness.records.results import Run
from tests.synthetic import steps_frame
from tests.test_simulate import recorded


def uneven_pair() -> tuple[dict[str, Any], pd.DataFrame]:
    """Worker 0 slowed 3x computing 6 ms +- 1, worker 1 2 ms, 80 steps, 10 of warm-up."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 1, size=(80, 2)) * [1.0, 0.2]
    meta, steps = recorded(steps_frame(80, lambda r, s: [6.0, 2.0][r] + noise[s, r]),
                           slowdowns=(3.0, 1.0))
    meta["run"]["warmup_steps"] = 10
    meta["standalone"] = [{"rank": 0, "samples_per_s": 4000.0},
                          {"rank": 1, "samples_per_s": 12000.0}]
    return meta, steps


def test_the_runs_table_and_compare_read_the_same_values() -> None:
    meta, steps = uneven_pair()
    row = runs_table([Run.of(meta, steps)]).iloc[0]
    values = run_metrics(steps, 10, meta)
    run_level = values[values["worker"] == RUN_LEVEL].set_index("metric")["value"]
    # every compared run-level metric has a value here (the manifest gives the standalone
    # rates and the slowdowns), and the runs table shows the same number
    assert set(run_level.index) == {m.name for m in registry.METRICS
                                    if m.compared and m.level == registry.RUN}
    for name, value in run_level.items():
        assert row[name] == pytest.approx(value, rel=1e-12), name
    # the table has every run-level metric, compared or not
    assert set(registry.RUN_LEVEL_NAMES) <= set(row.index)
    assert row["step_time_ms"] == pytest.approx(6.0 + 0.5 + 0.1, abs=0.3)
    assert 0 < row["efficiency"] < 1 and row["dropped_share"] == 0.0


def test_selected_metrics_only_and_workers_by_rank() -> None:
    meta, steps = uneven_pair()
    view = registry.RunView(steps, meta)
    got = list(registry.values(view, lambda name: name in ("compute_ms", "samples_per_s")))
    assert [(rank, name) for rank, name, _ in got] == [(None, "samples_per_s"),
                                                       (0, "compute_ms"), (1, "compute_ms")]
    compute = {rank: value for rank, name, value in got if name == "compute_ms"}
    assert compute[0] == pytest.approx(6.0, abs=0.3) and compute[1] == pytest.approx(2.0,
                                                                                      abs=0.1)
    assert view.warmup == 10 and view.steps["step"].min() == 10


def test_a_compared_metric_must_say_which_way_is_better() -> None:
    with pytest.raises(ValueError, match="needs a better direction"):
        registry.Metric("spread", registry.RUN, None, "spread", "a spread",
                        lambda v: math.nan)
    assert all(m.definition and m.heading for m in registry.METRICS)
    assert len(registry.BY_NAME) == len(registry.METRICS)  # names are unique
    assert registry.definitions(["idle_fraction", "not a metric"]) == [
        f"- `idle_fraction` (idle fraction): {registry.BY_NAME['idle_fraction'].definition}."]
