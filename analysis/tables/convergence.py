"""Statistical efficiency: held-out metric over time and time to target (DESIGN.md metrics).

Inputs are the held-out evaluations of runs (eval.parquet: step, samples, wall_s, train_s,
eval_s, loss, and the workload's metric column, accuracy or token_accuracy) with their
manifests. Time to target is the first evaluation at which the run's target is reached
(MLPerf's reading: evaluations are the only points where quality is known), in steps and in
seconds of training (`train_s`, evaluation pauses excluded) and of wall time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from hetbench.harness.records.results import Run

METRICS = ("accuracy", "token_accuracy")
CONVERGENCE_METRICS = ("steps_to_target", "time_to_target_s", "wall_to_target_s",
                       "final_metric", "final_loss")


def metric_column(evals: pd.DataFrame) -> str | None:
    """The workload's held-out metric in this frame (accuracy or token accuracy)."""
    return next((m for m in METRICS if m in evals.columns), None)


def time_to_target(evals: pd.DataFrame, metric: str, value: float) -> dict[str, float]:
    """Steps, training seconds and wall seconds until `metric` first reaches `value`
    (loss: at or below; accuracies: at or above); NaN where it never does."""
    never = {"steps_to_target": np.nan, "time_to_target_s": np.nan,
             "wall_to_target_s": np.nan}
    if evals.empty or metric not in evals:
        return never
    ordered = evals.sort_values("step")
    series = ordered[metric]
    hit = series <= value if metric == "loss" else series >= value
    if not hit.any():
        return never
    first = ordered[hit.to_numpy()].iloc[0]
    return {"steps_to_target": float(first["step"]), "time_to_target_s": float(first["train_s"]),
            "wall_to_target_s": float(first["wall_s"])}


def convergence_row(run: Run) -> dict[str, Any] | None:
    """One run's statistical efficiency, or None when it made no held-out evaluation."""
    evals = run.evals
    if evals.empty:
        return None
    metric = metric_column(evals)
    target = run.spec.get("target") or {}
    last = evals.sort_values("step").iloc[-1]
    row: dict[str, Any] = {
        "run_id": run.run_id, "run": run.name,
        "repeat": run.repeat, "workload": run.spec.get("workload", ""),
        "metric": metric or "loss", "target_metric": target.get("metric", ""),
        "target": target.get("value", np.nan),
        "final_metric": float(last[metric]) if metric else np.nan,
        "final_loss": float(last["loss"]), "final_step": int(last["step"]),
    }
    if target:
        row.update(time_to_target(evals, target["metric"], float(target["value"])))
        row["reached"] = bool(np.isfinite(row["steps_to_target"]))
    else:
        row.update({k: np.nan for k in CONVERGENCE_METRICS[:3]}, reached=False)
    return row


def convergence_table(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per run that evaluated (see convergence_row)."""
    rows = [row for run in runs if (row := convergence_row(run)) is not None]
    return pd.DataFrame(rows)


def convergence_groups(table: pd.DataFrame) -> pd.DataFrame:
    """Per run name: repeats, how many reached the target, and mean with a 95% t interval
    over the repeats that reached it (hetbench.analysis.tables.runs.group_table)."""
    from hetbench.analysis.tables.runs import group_table

    if table.empty:
        return pd.DataFrame()
    groups = group_table(table, by=["run"], metrics=CONVERGENCE_METRICS)
    counts = table.groupby("run", sort=False).agg(repeats=("repeat", "count"),
                                                 reached=("reached", "sum"))
    return groups.merge(counts.reset_index(), on="run")


def curves(runs: Sequence[Run]) -> pd.DataFrame:
    """Long form for the figure: run, repeat, step, train_s, measure (loss or the metric),
    value."""
    frames = []
    for run in runs:
        evals = run.evals
        if evals.empty:
            continue
        metric = metric_column(evals)
        keep = ["loss", *([metric] if metric else [])]
        long = evals.melt(id_vars=["step", "train_s"], value_vars=keep, var_name="measure",
                          value_name="value")
        long["run"] = run.name
        long["repeat"] = run.repeat
        frames.append(long)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
