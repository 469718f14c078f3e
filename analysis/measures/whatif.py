"""What-if: how long the run would have taken without variability, or without imbalance.

Each step is modelled as the latest worker's compute plus what follows it (communication,
update, skew): step_time = max_i compute[i] + rest. A scenario replaces compute[i] and
keeps `rest`, so only the effect of compute differences is measured. Compute is read
through each worker's fitted cost model (hetbench.analysis.measures.costmodel: line(n) x
slowdown(step) x residual), so a slice that changes or an emulated slowdown that jumps is not
variability:

- actual:               the recorded step times;
- no_variability:       every worker at its typical speed (median residual) for the slice
                        and slowdown it had that step (DESIGN.md what-if);
- balanced:             the same, and each step's batch split so that all workers finish
                        together (the cost models' equal-finish point, intercepts kept);
- fastest:              every worker at the fastest worker's time per sample that step.

cost of variability = actual / no_variability - 1; cost of the mean imbalance (what the
partition leaves on the table) = no_variability / balanced - 1; cost of heterogeneity (what
having slower workers costs at all: issue 3's "every worker at the fastest per-sample rate")
= no_variability / fastest - 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.measures import costmodel
from hetbench.analysis.view.metrics import after_warmup, complete_steps, instrumented, with_derived

SCENARIOS = ("actual", "no_variability", "balanced", "fastest")
COSTS = ("cost_of_variability", "cost_of_imbalance", "cost_of_heterogeneity")


def what_if(steps: pd.DataFrame, warmup_steps: int = 0,
            manifest: dict[str, Any] | None = None) -> pd.DataFrame:
    """Columns: scenario, total_s, slowdown (actual total / scenario total). `manifest`
    gives the emulated slowdown schedule (without it, none is assumed)."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=["scenario", "total_s", "slowdown"])
    d = with_derived(steps).sort_values(["step", "rank"])
    fit = costmodel.fit(d, manifest)
    ranks = sorted(fit.lines)
    rows = fit.rows.assign(level=fit.rows.groupby("rank")["residual"].transform("median"))
    # (steps x workers) grids; NaN where a worker was left out of the step (no row)
    n, slowdown, level = _grids(rows, ("batch_size", "slowdown", "level"), ranks)
    computing = ~np.isnan(n)
    n = np.where(computing, n, 0.0)
    factor = np.where(computing, slowdown * level, 1.0)  # per (step, worker)
    a = np.array([fit.lines[r].a_ns for r in ranks])
    b = np.array([fit.lines[r].b_ns for r in ranks])
    typical = np.where(computing, (a + b * n) * factor, 0.0)
    per_sample = np.where(computing, typical / np.where(computing, n, 1.0), np.inf)
    g = d.groupby("step")
    step_ns = (g["end_ns"].max() - g["begin_ns"].min()).to_numpy(float)
    rest = step_ns - g["compute_ns"].max().to_numpy(float)
    scenario_compute = {
        "no_variability": typical.max(axis=1),
        "balanced": _equal_finish(a * factor, b * factor, n.sum(axis=1), computing),
        "fastest": (n * per_sample.min(axis=1, keepdims=True)).max(axis=1),
    }
    totals = {"actual": float(step_ns.sum())}
    for name, compute in scenario_compute.items():
        totals[name] = float((compute + rest).sum())
    out = pd.DataFrame({"scenario": list(SCENARIOS),
                        "total_s": [totals[s] / 1e9 for s in SCENARIOS]})
    out["slowdown"] = totals["actual"] / 1e9 / out["total_s"]
    return out


def _grids(rows: pd.DataFrame, columns: tuple[str, ...], ranks: list[int]
           ) -> list[np.ndarray]:
    """Each column as a (steps x workers) array in step and rank order, NaN where a worker
    has no row (left out of the step)."""
    if len(rows) == len(ranks) * rows["step"].nunique():  # every worker every step
        ordered = rows.sort_values(["step", "rank"])
        return [ordered[c].to_numpy(float).reshape(-1, len(ranks)) for c in columns]
    return [rows.pivot(index="step", columns="rank", values=c).reindex(columns=ranks)
            .sort_index().to_numpy(float) for c in columns]


def _equal_finish(a: np.ndarray, b: np.ndarray, total: np.ndarray,
                  computing: np.ndarray) -> np.ndarray:
    """Per step (rows), the time T at which slices n_i = (T - a_i) / b_i summing to the
    step's samples all finish, among the workers `computing` that step; a worker whose
    fixed cost alone exceeds T gets nothing (the others share the batch: repeated until
    every share is non-negative)."""
    use = computing.copy()
    for _ in range(a.shape[1]):
        finish = (total + np.where(use, a / b, 0).sum(axis=1)) / np.where(
            use, 1 / b, 0).sum(axis=1)
        negative = use & (finish[:, None] < a)
        if not negative.any():
            break
        use &= ~negative
    return finish


def costs(what: pd.DataFrame) -> dict[str, float]:
    """cost_of_variability, cost_of_imbalance and cost_of_heterogeneity as fractions of
    the shorter time (module docstring)."""
    if what.empty:
        return dict.fromkeys(COSTS, float("nan"))
    t = what.set_index("scenario")["total_s"]
    return {"cost_of_variability": float(t["actual"] / t["no_variability"] - 1),
            "cost_of_imbalance": float(t["no_variability"] / t["balanced"] - 1),
            "cost_of_heterogeneity": float(t["no_variability"] / t["fastest"] - 1)}
