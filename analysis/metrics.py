"""Metrics as DESIGN.md defines them, from steps.parquet rows (one per worker and step).

Input columns: rank, step, batch_size, begin_ns, ready_ns, reduced_ns, end_ns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def with_derived(steps: pd.DataFrame) -> pd.DataFrame:
    """Adds, per row: compute_ns = ready - begin; arrival_ns = latest ready of the step;
    idle_ns = arrival - ready (idle before all-reduce); comm_ns = reduced - arrival;
    busy_ns = end - begin."""
    out = steps.copy()
    out["compute_ns"] = out["ready_ns"] - out["begin_ns"]
    out["arrival_ns"] = out.groupby("step")["ready_ns"].transform("max")
    out["idle_ns"] = out["arrival_ns"] - out["ready_ns"]
    out["comm_ns"] = out["reduced_ns"] - out["arrival_ns"]
    out["busy_ns"] = out["end_ns"] - out["begin_ns"]
    return out


def after_warmup(steps: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    return steps[steps["step"] >= warmup_steps]


def instrumented(steps: pd.DataFrame) -> bool:
    return bool(len(steps)) and bool((steps["ready_ns"] > 0).all())


def run_summary(steps: pd.DataFrame, warmup_steps: int = 0) -> dict[str, float]:
    """samples/s, mean step time (ms) and idle fraction over the steps after warm-up.

    Only steps that every worker recorded count (a failed run's last flushed step may be
    missing for some workers)."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty:
        return {"steps": 0, "samples_per_s": np.nan, "mean_step_ms": np.nan,
                "idle_fraction": np.nan}
    per_step = steps.groupby("step").agg(begin=("begin_ns", "min"), end=("end_ns", "max"),
                                         samples=("batch_size", "sum"))
    wall_s = (per_step["end"].max() - per_step["begin"].min()) / 1e9
    summary = {
        "steps": int(len(per_step)),
        "samples_per_s": float(per_step["samples"].sum() / wall_s) if wall_s > 0 else np.nan,
        "mean_step_ms": float((per_step["end"] - per_step["begin"]).mean() / 1e6),
        "idle_fraction": np.nan,
    }
    if instrumented(steps):
        derived = with_derived(steps)
        summary["idle_fraction"] = float(derived["idle_ns"].sum() / derived["busy_ns"].sum())
    return summary


def worker_summary(steps: pd.DataFrame, warmup_steps: int = 0) -> pd.DataFrame:
    """Per worker: mean slice size, mean and CV of compute time, mean idle before all-reduce.

    Columns: rank, batch_size, compute_mean_ms, compute_cv, idle_mean_ms, loss_last."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    columns = ["rank", "batch_size", "compute_mean_ms", "compute_cv", "idle_mean_ms"]
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=columns)
    derived = with_derived(steps)
    grouped = derived.groupby("rank")
    compute = grouped["compute_ns"]
    out = pd.DataFrame({
        "batch_size": grouped["batch_size"].mean(),
        "compute_mean_ms": compute.mean() / 1e6,
        "compute_cv": compute.std(ddof=1) / compute.mean(),
        "idle_mean_ms": grouped["idle_ns"].mean() / 1e6,
    }).reset_index()
    return out[columns]


def complete_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Rows of the steps that every worker of the run recorded."""
    if steps.empty:
        return steps
    world = steps["rank"].nunique()
    counts = steps.groupby("step")["rank"].transform("nunique")
    return steps[counts == world]
