"""Each worker's compute time as a cost model in its slice size: one fit from the records,
shared by the replay (hetbench.analysis.tables.repartition) and the scale-out simulator
(hetbench.analysis.models.simulate).

    compute(step) = (a + b * n) * slowdown(step) * residual(step)

- n: the worker's slice that step;
- slowdown: the emulated factor the suite's schedule gave that step (`slowdown`,
  `slowdown_at`, `jitter`; 1 on a real device), read from the manifest, so that a
  schedule's jump is the schedule's and not the worker's variability;
- a, b: least squares of compute / slowdown on n after warm-up, by the rule the adaptive
  partition policies use during a run (hetbench.harness.partition.policies.fit_line): with one slice
  size only, or a line that is not increasing with a non-negative intercept, a = 0 and b the
  mean time per sample;
- residual: what the line and the schedule leave, the worker's own variability (median
  about 1), in step order so that its autocorrelation and tails are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.view.metrics import (
    after_warmup,
    complete_steps,
    lockstep,
    run_summary,
    with_derived,
)
from hetbench.harness.partition.policies import WindowStats, equal_finish, largest_remainder
from hetbench.harness.partition.policies import fit_line as partition_fit_line
from hetbench.harness.spec.workers import WorkerSpec


@dataclass(frozen=True)
class Line:
    """Compute time (ns) = a + b * n, before any emulated slowdown."""

    a_ns: float
    b_ns: float

    def at(self, n: Any) -> Any:
        return self.a_ns + self.b_ns * n


def fit_line(n: np.ndarray, t: np.ndarray) -> Line:
    """The line through (slice size, time) points by the rule the adaptive partition
    policies apply while a run goes (hetbench.harness.partition.policies.fit_line: least squares;
    with too little spread in n, or a negative intercept or slope, the line through the origin and
    the mean), so that the analysis and the policies read a worker the same way."""
    n, t = np.asarray(n, float), np.asarray(t, float)
    if len(n) == 0:
        return Line(0.0, float("nan"))
    sums = WindowStats(float(len(n)), float(n.sum()), float(t.sum()), float(n @ n),
                       float(n @ t))
    a, b = partition_fit_line(sums)
    return Line(float(a), float(b))


def worker_specs(manifest: dict[str, Any] | None) -> list[WorkerSpec]:
    """The suite's workers as specs (slowdown schedule and jitter), [] when unrecorded."""
    specs = []
    for w in (manifest or {}).get("run", {}).get("workers") or []:
        at = w.get("slowdown_at")
        jitter = w.get("jitter")
        specs.append(WorkerSpec(
            slowdown=float(w.get("slowdown", 1.0)),
            slowdown_at=tuple((int(s), float(f)) for s, f in at) if at else None,
            jitter=(float(jitter[0]), float(jitter[1])) if jitter else None))
    return specs


def slowdowns(steps: pd.DataFrame, manifest: dict[str, Any] | None,
              jitter: bool = True) -> np.ndarray:
    """Per row, the emulated slowdown its worker had at its step (1 where none); without
    `jitter`, the schedule's alone (what the jitter multiplies)."""
    specs = worker_specs(manifest)
    if not jitter:
        specs = [replace(s, jitter=None) for s in specs]
    seed = int((manifest or {}).get("run", {}).get("seed", 0))
    out = np.ones(len(steps))
    ranks, step_numbers = steps["rank"].to_numpy(), steps["step"].to_numpy()
    for rank in np.unique(ranks):
        if rank >= len(specs) or not specs[rank].emulated:
            continue
        spec, rows = specs[rank], ranks == rank
        if spec.varies:
            out[rows] = [spec.factor_at(int(s), seed, int(rank)) for s in step_numbers[rows]]
        else:
            out[rows] = spec.slowdown
    return out


@dataclass(frozen=True)
class CostFit:
    """`lines`: each rank's Line; `rows`: per (rank, step) after warm-up, with columns
    step, rank, batch_size, compute_ns, slowdown, model_ns (line x slowdown), residual."""

    lines: dict[int, Line]
    rows: pd.DataFrame

    def residuals(self, rank: int) -> np.ndarray:
        rows = self.rows[self.rows["rank"] == rank].sort_values("step")
        return rows["residual"].to_numpy()


def fit(steps: pd.DataFrame, manifest: dict[str, Any] | None = None,
        warmup_steps: int = 0) -> CostFit:
    """Fit every worker's cost model from a run's steps (complete steps after warm-up)."""
    d = with_derived(complete_steps(after_warmup(steps, warmup_steps)))
    factor = slowdowns(d, manifest)
    lines, parts = {}, []
    for rank in sorted(d["rank"].unique()):
        rows = (d["rank"] == rank).to_numpy()
        n = d["batch_size"].to_numpy(float)[rows]
        t = d["compute_ns"].to_numpy(float)[rows]
        line = fit_line(n, t / factor[rows])
        model = line.at(n) * factor[rows]
        lines[int(rank)] = line
        parts.append(pd.DataFrame({
            "step": d["step"].to_numpy()[rows], "rank": int(rank), "batch_size": n,
            "compute_ns": t, "slowdown": factor[rows], "model_ns": model,
            "residual": t / model}))
    columns = ["step", "rank", "batch_size", "compute_ns", "slowdown", "model_ns", "residual"]
    rows_frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    return CostFit(lines, rows_frame)


def oracle(steps: pd.DataFrame, manifest: dict[str, Any] | None = None,
           warmup_steps: int = 0) -> dict[str, Any]:
    """The best static partition of the run, from the fitted cost models, and the step time
    it would reach: each worker's line scaled by its median slowdown x residual (its
    typical speed), slices where all finish together (at least one sample each), plus the
    run's median time from the last arrival to the step's end (communication, update).
    `oracle_efficiency` = that step time / the run's mean step time: 1 when the run
    matches the best static partition with no variability; above 1 when adapting beat it."""
    empty = {"oracle_sizes": None, "oracle_step_ms": np.nan, "oracle_efficiency": np.nan}
    d = with_derived(complete_steps(after_warmup(steps, warmup_steps)))
    if d.empty or not lockstep(d):
        return empty
    fit_ = fit(d, manifest)
    rows = fit_.rows.assign(level=fit_.rows["slowdown"] * fit_.rows["residual"])
    level = rows.groupby("rank")["level"].median()
    lines = [(fit_.lines[r].a_ns * level[r], fit_.lines[r].b_ns * level[r])
             for r in sorted(fit_.lines)]
    total = int(d.groupby("step")["batch_size"].sum().median())
    shares = equal_finish(total, lines, 1)
    if shares is None:
        return empty
    sizes = largest_remainder(total, shares, minimum=1)
    compute = max(a + b * n for (a, b), n in zip(lines, sizes, strict=True))
    g = d.groupby("step")
    rest = float(((g["end_ns"].max() - g["begin_ns"].min()) - g["compute_ns"].max()).median())
    step_ms = (compute + rest) / 1e6
    measured = run_summary(d)["mean_step_ms"]
    return {"oracle_sizes": list(sizes), "oracle_step_ms": step_ms,
            "oracle_efficiency": step_ms / measured if measured else np.nan}


def residual_cv(steps: pd.DataFrame, manifest: dict[str, Any] | None = None,
                warmup_steps: int = 0) -> pd.Series:
    """Per worker, the coefficient of variation of its residual: its variability against its
    cost model (a moved slice or a scheduled slowdown is not variability; the compute CV
    counts both)."""
    d = complete_steps(after_warmup(steps, warmup_steps))
    if d.empty:
        return pd.Series(dtype=float)
    residual = fit(d, manifest).rows.groupby("rank")["residual"]
    return residual.std(ddof=1) / residual.mean()
