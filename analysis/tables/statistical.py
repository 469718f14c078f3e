"""Statistical efficiency of the schemes that change the gradient: how many more steps
than BSP a scheme takes to a held-out target, from what it does to the updates.

    steps to target / BSP's steps to target = 1 + a x staleness + b x dropped + c x (H - 1)

staleness: the mean over the run's updates (hetbench.analysis.tables.registry `staleness_mean`);
dropped: the share of computed gradients dropped (`dropped_share`, backup); H: local SGD's
averaging period (1 for every other scheme). A run is BSP's when all three are at rest.

Fitted by non-negative least squares on recorded runs of one job under several schemes
(the `sync` suite): each scheme one point, the mean over its repeats that reached the
target. A coefficient whose feature no fitted scheme moves stays unknown, and a scheme
that needs it gets no prediction. `leave_one_out` validates the model: each scheme
predicted from the others (a scheme alone in moving a feature cannot be).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.tables.convergence import time_to_target
from hetbench.analysis.tables.runs import run_row
from hetbench.harness.records.results import Run
from hetbench.harness.spec.aggregators import AGGREGATORS, recorded_name

FEATURES = ("staleness", "dropped", "period")


def period(manifest: dict[str, Any]) -> int:
    """The steps between parameter averages of a scheme that averages them (local SGD's
    H: its Kind's `moves`, the key of its `staleness_bound`); 1 for every other scheme."""
    aggregator = manifest.get("run", {}).get("aggregator") or {}
    kind = AGGREGATORS.get(recorded_name(manifest.get("run", {})))
    if kind is None or kind.moves != "parameters":
        return 1
    return int(aggregator.get(kind.staleness_bound, 1))


def scheme_points(runs: Sequence[Run], metric: str, value: float) -> pd.DataFrame:
    """One row per run name (scheme): its features (means over repeats), steps to the
    target (the mean over the repeats that reached it), how many repeats ran and reached
    it."""
    rows = []
    for run in runs:
        row = run_row(run)
        rows.append({"run": row["run"], "staleness": _number(row.get("staleness_mean")),
                     "dropped": _number(row.get("dropped_share")),
                     "period": float(period(run.manifest)),
                     "steps_to_target": time_to_target(run.evals, metric, value)[
                         "steps_to_target"]})
    table = pd.DataFrame(rows, columns=["run", *FEATURES, "steps_to_target"])
    grouped = table.groupby("run", sort=False)
    out = grouped[list(FEATURES)].mean()
    out["steps_to_target"] = grouped["steps_to_target"].mean()  # NaN (not reached) skipped
    out["repeats"] = grouped.size()
    out["reached"] = grouped["steps_to_target"].count()
    return out.reset_index()


def _number(value: Any) -> float:
    return 0.0 if value is None or (isinstance(value, float) and math.isnan(value)) \
        else float(value)


def exact(points: pd.DataFrame) -> pd.Series:
    """The schemes that keep BSP's gradient: nothing stale, dropped or local."""
    return pd.Series(~design(points).any(axis=1), index=points.index)


# Below these a feature reads as at rest: ssp and ps-async drop a few of the last steps'
# pushes (0.2-0.3% in the sync suite), which must not make the dropped share look fitted.
AT_REST = {"staleness": 0.01, "dropped": 0.01, "period": 1.0}


def design(frame: pd.DataFrame) -> np.ndarray:
    """The model's columns: staleness, dropped share, H - 1, each 0 where at rest."""
    columns = [frame[f].where(frame[f] > AT_REST[f], AT_REST[f] if f == "period" else 0.0)
               for f in FEATURES]
    return np.column_stack([columns[0], columns[1], columns[2] - 1])


@dataclass(frozen=True)
class StepsModel:
    bsp_steps: float  # BSP's steps to target (mean over the exact schemes' points)
    coefficients: tuple[float, float, float]  # a, b, c; NaN where unknown
    schemes: tuple[str, ...]  # the schemes fitted

    def steps(self, staleness: float, dropped: float, period: float) -> float:
        """Predicted steps to target; NaN where a feature it moves has no coefficient."""
        features = pd.DataFrame({"staleness": [staleness], "dropped": [dropped],
                                 "period": [period]})
        total = 1.0
        for x, coefficient in zip(design(features)[0], self.coefficients, strict=True):
            if x:
                total += coefficient * x  # NaN when unknown
        return self.bsp_steps * total


def fit(points: pd.DataFrame) -> StepsModel | None:
    """The model from schemes that reached the target, or None without an exact scheme
    (BSP's steps) among them."""
    from scipy.optimize import nnls

    reached = points.dropna(subset=["steps_to_target"])
    base = reached[exact(reached)]
    if base.empty:
        return None
    bsp = float(base["steps_to_target"].mean())
    others = reached[~exact(reached)]
    coefficients = [math.nan] * len(FEATURES)
    if not others.empty:
        x = design(others)
        moved = np.flatnonzero(np.abs(x).sum(axis=0) > 0)
        solution, _ = nnls(x[:, moved], others["steps_to_target"].to_numpy() / bsp - 1)
        for column, value in zip(moved, solution, strict=True):
            coefficients[column] = float(value)
    return StepsModel(bsp, (coefficients[0], coefficients[1], coefficients[2]),
                      tuple(reached["run"]))


def leave_one_out(points: pd.DataFrame) -> pd.DataFrame:
    """Each scheme that changes the gradient predicted from the others: run, measured and
    predicted steps to target, error (NaN where the others leave its feature unknown)."""
    reached = points.dropna(subset=["steps_to_target"])
    rows = []
    for index, row in reached[~exact(reached)].iterrows():
        model = fit(reached.drop(index))
        predicted = model.steps(row["staleness"], row["dropped"], row["period"]) \
            if model is not None else math.nan
        rows.append({"run": row["run"], "measured": row["steps_to_target"],
                     "predicted": predicted,
                     "error": predicted / row["steps_to_target"] - 1})
    return pd.DataFrame(rows, columns=["run", "measured", "predicted", "error"])
