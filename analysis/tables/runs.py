"""Several runs and repeats together: one row per run, then groups with confidence
intervals. Repeats (separate launches) are the unit of replication, not steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.tables import registry
from hetbench.analysis.view.metrics import phase_stats, run_summary
from hetbench.harness.records.results import Run

# the run-level metrics of the registry: the runs table's columns after its identity
RUN_METRICS = registry.RUN_LEVEL_NAMES


def slowdowns(manifest: dict[str, Any]) -> dict[int, float]:
    return {i: float(w.get("slowdown", 1.0))
            for i, w in enumerate(manifest.get("run", {}).get("workers", []))}


def device_mix(manifest: dict[str, Any]) -> str:
    workers = manifest.get("run", {}).get("workers", [])
    labels = []
    for w in workers:
        label = f"{w.get('device', '?')} x{w.get('threads', 1)}"
        if float(w.get("slowdown", 1.0)) != 1.0:
            label += f" /{float(w['slowdown']):g}"
        if w.get("jitter"):
            label += f" ~{float(w['jitter'][1]):g}"  # noisy: slowed that much at times
        labels.append(label)
    return " + ".join(labels)




def run_row(recorded: Run) -> dict[str, Any]:
    """One run's identity and every run-level metric of hetbench.analysis.tables.registry
    (after its warm-up steps); worked out once per run (the report, its figures, the
    schemes' and the repartitioning tables read it)."""
    return dict(recorded.once("run_row", lambda: _run_row(recorded)))


def run_tables(run: Run) -> dict[str, pd.DataFrame]:
    """analyse_run of the run's steps after its warm-up, worked out once per run (the
    report's section of the run and the figures of causes and what-if read it)."""
    return run.once("analyse_run", lambda: analyse_run(
        run.steps, run.warmup_steps, slowdowns(run.manifest), run.manifest))


def _run_row(recorded: Run) -> dict[str, Any]:
    manifest, run = recorded.manifest, recorded.spec
    view = registry.RunView(recorded.steps, manifest)
    frameworks = sorted({w.get("framework", run.get("framework", "?"))
                         for w in run.get("workers", [])}) or [run.get("framework", "?")]
    expected_steps = int(run.get("steps", 0)) - view.warmup
    return {
        "run_id": recorded.run_id,
        "suite": manifest.get("suite", {}).get("name", ""),
        "run": recorded.name,
        "repeat": recorded.repeat,
        "launch": recorded.launch,
        "status": recorded.status,
        "partial": view.summary["steps"] < expected_steps,
        # more worker threads than cores (recorded since hetbench records it)
        "oversubscribed": bool((manifest.get("load") or {}).get("oversubscribed", False)),
        "framework": "+".join(frameworks),
        "workload": run.get("workload", ""),
        "dataset": run.get("dataset", ""),
        "policy": run.get("partition", {}).get("policy", ""),
        "aggregator": recorded.aggregator,
        "devices": device_mix(manifest),
        "heterogeneity": manifest.get("heterogeneity", ""),
        "steps": view.summary["steps"],
        **registry.run_values(view),
    }


def runs_table(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per run (see run_row), in the given order."""
    return pd.DataFrame([run_row(run) for run in runs])


def group_table(table: pd.DataFrame, by: Sequence[str] = ("run",),
                metrics: Sequence[str] = RUN_METRICS) -> pd.DataFrame:
    """Per group and metric: n (repeats), mean, std, and a 95% t confidence interval over
    repeats (NaN bounds with one repeat). Tidy: group keys, metric, n, mean, std, ci_low,
    ci_high."""
    from scipy import stats

    long = table.melt(id_vars=list(by), value_vars=list(metrics), var_name="metric",
                      value_name="value").dropna(subset=["value"])
    g = long.groupby([*by, "metric"], sort=False)["value"]
    out = g.agg(n="count", mean="mean", std="std").reset_index()
    half = stats.t.ppf(0.975, np.maximum(out["n"] - 1, 1)) * out["std"] / np.sqrt(out["n"])
    half = half.where(out["n"] > 1)
    out["ci_low"] = out["mean"] - half
    out["ci_high"] = out["mean"] + half
    return out


def analyse_run(steps: pd.DataFrame, warmup_steps: int = 0,
                slowdown: dict[int, float] | None = None,
                manifest: dict[str, Any] | None = None) -> dict[str, pd.DataFrame]:
    """Every per-run table the report shows: metrics, variability, idle, stragglers and
    their causes, persistence and what-if (what the 1M-record benchmark times)."""
    from hetbench.analysis.measures.stragglers import (
        attribute,
        cause_shares,
        compute_breakdown,
        straggler_summary,
    )
    from hetbench.analysis.measures.whatif import what_if
    from hetbench.analysis.trends.failslow import detect
    from hetbench.analysis.trends.persistence import autocorrelation, change_points
    from hetbench.analysis.view.metrics import (
        after_warmup,
        complete_steps,
        step_metrics,
        with_derived,
        worker_idle,
        worker_summary,
    )

    # Filter and derive once; every function below then skips that work.
    d = with_derived(complete_steps(after_warmup(steps, warmup_steps)))
    per_step = step_metrics(d)
    attribution = attribute(d, 0, slowdown, per_step, manifest)
    return {
        "summary": pd.DataFrame([run_summary(d)]),
        "workers": worker_summary(d),
        "phases": phase_stats(d),
        "steps": per_step,
        "idle": worker_idle(d),
        "stragglers": straggler_summary(d, per_step=per_step),
        "attribution": attribution,
        "causes": cause_shares(attribution),
        "breakdown": compute_breakdown(d),
        "autocorrelation": autocorrelation(d),
        "change_points": change_points(d),
        "failslow": detect(d),
        "what_if": what_if(d, 0, manifest),
    }
