"""Time to target and the report's held-out section, from evaluation records built by hand
with known answers (analysis/tables/convergence.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.render import report
from hetbench.analysis.tables.convergence import (
    convergence_groups,
    convergence_table,
    curves,
    time_to_target,
)
from hetbench.harness.records.results import Run


def evals(accuracy: list[float], loss: list[float], seconds_per_eval: float) -> pd.DataFrame:
    steps = [10 * i for i in range(len(accuracy))]
    return pd.DataFrame({"step": steps, "samples": [s * 64 for s in steps],
                         "wall_s": [1.1 * seconds_per_eval * i for i in range(len(steps))],
                         "train_s": [seconds_per_eval * i for i in range(len(steps))],
                         "eval_s": 0.1, "loss": loss, "accuracy": accuracy,
                         "heldout_samples": 100})


def manifest(name: str, repeat: int, target: dict | None) -> dict:
    return {"run_id": f"{name}-r{repeat}", "repeat": repeat,
            "run": {"name": name, "workload": "resnet", "target": target}}


def evaluated(meta: dict, frame: pd.DataFrame) -> Run:
    """A run known by its evaluations alone (no steps)."""
    return Run.of(meta, pd.DataFrame(), evals=frame)


def test_time_to_target_is_the_first_evaluation_that_reaches_it() -> None:
    frame = evals([0.1, 0.35, 0.6, 0.55, 0.7], [2.3, 1.9, 1.2, 1.3, 0.9], 2.0)
    assert time_to_target(frame, "accuracy", 0.6) == {
        "steps_to_target": 20.0, "time_to_target_s": 4.0, "wall_to_target_s": 4.4}
    # a loss target is reached at or below the value
    assert time_to_target(frame, "loss", 1.3)["steps_to_target"] == 20.0
    assert time_to_target(frame, "loss", 0.95)["steps_to_target"] == 40.0
    never = time_to_target(frame, "accuracy", 0.71)
    assert all(math.isnan(v) for v in never.values())


def test_groups_count_repeats_that_reached_and_average_only_those() -> None:
    target = {"metric": "accuracy", "value": 0.5}
    runs = [evaluated(manifest("fast", 0, target), evals([0.1, 0.6, 0.7], [2, 1, 0.8], 1.0)),
            evaluated(manifest("fast", 1, target), evals([0.1, 0.4, 0.6], [2, 1.5, 1.0], 1.0)),
            evaluated(manifest("slow", 0, target), evals([0.1, 0.2, 0.3], [2, 1.9, 1.8], 3.0)),
            evaluated(manifest("none", 0, None), pd.DataFrame())]
    table = convergence_table(runs)
    assert list(table["run"]) == ["fast", "fast", "slow"]  # the run without evaluations: none
    assert list(table["reached"]) == [True, True, False]
    groups = convergence_groups(table).set_index(["run", "metric"])
    mean = groups.loc[("fast", "time_to_target_s")]
    assert mean["mean"] == 1.5 and mean["n"] == 2 and mean["reached"] == 2
    assert groups.loc[("fast", "final_metric"), "mean"] == pytest.approx(0.65)
    assert ("slow", "time_to_target_s") not in groups.index  # never reached: no number
    assert groups.loc[("slow", "final_loss"), "reached"] == 0

    section = "\n".join(report.convergence_section(runs))
    assert section.startswith("## Time to target")
    assert "| fast | accuracy | accuracy >= 0.5 | 2/2 | 1.5 |" in section
    assert "| slow | accuracy | accuracy >= 0.5 | 0/1 |" in section
    assert report.convergence_section(runs[3:]) == []  # nothing evaluated: no section

    long = curves(runs)
    assert set(long["measure"]) == {"loss", "accuracy"} and len(long) == 3 * 3 * 2
    assert np.allclose(long.loc[(long["run"] == "slow") & (long["measure"] == "loss"), "value"],
                       [2, 1.9, 1.8])
