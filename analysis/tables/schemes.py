"""Synchronisation schemes side by side: staleness, and hardware against statistical
efficiency (issue 13). Asynchronous and stale schemes trade one for the other: they cut
idle time (more samples/s) and pay in updates computed on old parameters (more steps, and
perhaps more time, to a held-out target).

Pure functions: recorded runs (records.results.Run) in, tidy frames out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.tables.convergence import convergence_table
from hetbench.analysis.tables.runs import group_table, runs_table
from hetbench.harness.records.results import Run
from hetbench.harness.spec.aggregators import AGGREGATORS, recorded_name

Runs = Sequence[Run]
# What `scheme_groups` summarises per run name, with 95% t intervals over repeats.
SCHEME_METRICS = ("samples_per_s", "idle_fraction", "staleness_mean", "dropped_share",
                  "steps_to_target", "time_to_target_s")


def staleness_bound(run: dict[str, Any]) -> float:
    """How stale an update may be, in the scheme's own unit, for the trade-off figure:
    0 for the synchronous schemes, s for ssp, D waves for wsp, H - 1 local steps for local
    SGD, infinity for ps-async and the native asynchronous cross-checks."""
    spec = run.get("aggregator") or {}
    kind = AGGREGATORS.get(recorded_name(run))
    bound = "none" if kind is None else kind.staleness_bound  # a name no longer registered
    if bound == "unbounded":
        return math.inf
    if bound == "staleness":
        return float(spec.get("staleness", 0))
    if bound == "local_steps":
        return float(spec.get("local_steps", 1) - 1)
    return 0.0


def _updates(run: Run) -> pd.DataFrame:
    """The rows that became updates (not dropped), after the run's warm-up steps."""
    steps = run.steps
    kept = steps[steps["step"] >= run.warmup_steps]
    if "dropped" in kept.columns:
        kept = kept[~kept["dropped"].to_numpy(dtype=bool)]
    return kept


def staleness_counts(runs: Runs) -> pd.DataFrame:
    """Per run (name, repeat) and staleness value: how many updates had it. Columns: run,
    repeat, aggregator, staleness, updates."""
    frames = []
    for run in runs:
        if run.steps.empty or "staleness" not in run.steps.columns:
            continue
        measured = _updates(run)["staleness"]
        counts = measured[measured >= 0].value_counts().sort_index()  # -1: not reported
        frames.append(pd.DataFrame({
            "run": run.name, "repeat": run.repeat,
            "aggregator": run.aggregator, "staleness": counts.index.astype(int),
            "updates": counts.to_numpy()}))
    columns = ["run", "repeat", "aggregator", "staleness", "updates"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(
        columns=columns)


def staleness_summary(counts: pd.DataFrame) -> pd.DataFrame:
    """Per run name, over all its repeats' updates: updates, mean, p50, p90, p99 and max
    staleness and the share of stale (> 0) updates."""
    rows = []
    for (name, aggregator), part in counts.groupby(["run", "aggregator"], sort=False):
        values = np.repeat(part["staleness"].to_numpy(), part["updates"].to_numpy())
        if not len(values):
            continue
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        rows.append({"run": name, "aggregator": aggregator, "updates": len(values),
                     "mean": float(values.mean()), "p50": float(p50), "p90": float(p90),
                     "p99": float(p99), "max": int(values.max()),
                     "stale_share": float((values > 0).mean())})
    return pd.DataFrame(rows, columns=["run", "aggregator", "updates", "mean", "p50", "p90",
                                       "p99", "max", "stale_share"])


def scheme_table(runs: Runs) -> pd.DataFrame:
    """One row per run: its scheme (aggregator, staleness bound), hardware efficiency
    (samples/s into updates, idle fraction), its staleness (mean over updates, share of
    computed gradients dropped) and statistical efficiency (steps and training seconds to
    the target; NaN where it was not reached)."""
    table = runs_table(runs)
    if table.empty:
        return pd.DataFrame()
    table["bound"] = [staleness_bound(run.spec) for run in runs]
    convergence = convergence_table(runs)
    columns = ["run_id", "steps_to_target", "time_to_target_s", "reached"]
    if convergence.empty:
        convergence = pd.DataFrame(columns=columns)
    table = table.merge(convergence[columns], on="run_id", how="left")
    return table[["run_id", "run", "repeat", "aggregator", "bound", *SCHEME_METRICS,
                  "reached"]]


def scheme_groups(table: pd.DataFrame) -> pd.DataFrame:
    """Per run name (scheme): mean and 95% t interval over repeats of SCHEME_METRICS (time
    and steps to target over the repeats that reached it), with how many did."""
    if table.empty:
        return pd.DataFrame()
    groups = group_table(table, by=["run", "aggregator", "bound"], metrics=SCHEME_METRICS)
    counts = table.groupby("run", sort=False).agg(
        repeats=("repeat", "count"), reached=("reached", lambda r: int(r.fillna(False).sum())))
    return groups.merge(counts.reset_index(), on="run")


def compares_schemes(runs: Runs) -> bool:
    """The runs use more than one aggregator, or one that is not all-reduce: worth a
    section of their own."""
    names = {run.aggregator for run in runs}
    baseline = {name for name, kind in AGGREGATORS.items() if kind.baseline}
    return len(names) > 1 or bool(names - baseline)
