"""When does adaptive repartitioning pay? Partition history, recovery after a change, time
to a target loss, and an offline replay that predicts a policy's step times from a run
recorded under another policy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from hetbench.analysis.measures import costmodel
from hetbench.analysis.view.metrics import after_warmup, complete_steps, instrumented, with_derived
from hetbench.harness.partition.policies import (
    ADAPTIVE,
    Damping,
    Repartitioner,
    WindowStats,
    equal_sizes,
    update_ends,
)
from hetbench.harness.records.results import Run


def slices_over_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The partition in effect at every step: columns step, rank, batch_size."""
    return steps[["step", "rank", "batch_size"]].sort_values(["step", "rank"]).reset_index(
        drop=True)


def step_balance(steps: pd.DataFrame) -> pd.Series:
    """Per step, mean over workers of compute time / the slowest worker's compute time:
    1 when every worker arrives together, 1/world when one does all the waiting. Unlike
    the step time it does not move when the whole machine speeds up or slows down (which
    it does here by 20-40% over tens of steps), only when the partition fits the workers
    better or worse."""
    d = with_derived(complete_steps(steps))
    compute = d.groupby("step")["compute_ns"]
    return compute.mean() / compute.max()


def recovery_steps(steps: pd.DataFrame, change_step: int, tolerance: float = 0.05,
                   window: int = 10, hold: int = 20) -> float:
    """Steps after `change_step` until the balance (step_balance; rolling median over
    `window` steps) is back within `tolerance` of its steady level after the change (the
    median of the run's last quarter) and stays there for `hold` steps. 0 if it never left
    (a static partition that is as bad after the change as it will stay); NaN if it never
    settles or the run is too short to tell."""
    balance = step_balance(steps)
    after = balance[balance.index >= change_step]
    if len(after) < 4 * (window + hold):
        return float("nan")
    steady = float(after.iloc[-len(after) // 4:].median())
    # centred: a trailing window would date the recovery up to `window` steps late
    rolling = after.rolling(window, min_periods=window, center=True).median().dropna()
    inside = (rolling >= steady * (1 - tolerance)).to_numpy()
    # a run of `hold` rolling values inside the band, starting at the first such run
    held = np.convolve(inside, np.ones(hold, dtype=int), mode="valid") == hold
    if not held.any():
        return float("nan")
    first = int(np.argmax(held))
    if first == 0:
        return 0.0
    return float(rolling.index[first] - change_step)


def time_to_loss(steps: pd.DataFrame, target: float, window: int = 5) -> float:
    """Seconds from the first step's begin until the rolling mean global loss first reaches
    `target`; NaN if it never does."""
    steps = complete_steps(steps)
    per_step = steps.groupby("step").agg(loss=("loss", "first"), end=("end_ns", "max"),
                                         begin=("begin_ns", "min"))
    rolling = per_step["loss"].rolling(window, min_periods=1).mean()
    reached = rolling[rolling <= target]
    if reached.empty:
        return float("nan")
    return float((per_step.loc[reached.index[0], "end"] - per_step["begin"].min()) / 1e9)


# -- offline replay --------------------------------------------------------------------------


def replay(steps: pd.DataFrame, policy: str, damping: Damping | None = None,
           initial: Sequence[int] | None = None, warmup_steps: int = 0,
           manifest: dict | None = None) -> pd.DataFrame:
    """Predict a run under `policy` ('equal', 'sizes' via `initial`, 'proportional' or
    'model') from a recorded run: each worker's compute at step s is its fitted cost
    model (hetbench.analysis.measures.costmodel: a + b*n for the replayed slice n, times the
    emulated slowdown of step s from `manifest`'s schedule) times its recorded residual at s; what
    follows compute (communication, update, skew) is kept from the record. The adaptive
    policies run the very code the harness runs (hetbench.harness.partition.policies.Repartitioner).

    Columns: step, rank, batch_size, compute_ms, idle_ms, step_ms."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=["step", "rank", "batch_size", "compute_ms", "idle_ms",
                                     "step_ms"])
    model = costmodel.fit(steps, manifest)
    world = len(model.lines)
    d = with_derived(steps)
    g = d.groupby("step")
    rest = (g["end_ns"].max() - g["begin_ns"].min()) - g["compute_ns"].max()
    total = int(g["batch_size"].sum().iloc[0])
    a = np.array([model.lines[r].a_ns for r in sorted(model.lines)])
    b = np.array([model.lines[r].b_ns for r in sorted(model.lines)])
    # what the line leaves for the step: its slowdown times its residual
    rows = model.rows.assign(factor=model.rows["slowdown"] * model.rows["residual"])
    residual = rows.pivot(index="step", columns="rank", values="factor")
    sizes = tuple(initial) if initial is not None else equal_sizes(total, world)
    damping = damping or Damping()
    policy_runner = Repartitioner(policy, total, world, damping) if policy in ADAPTIVE else None
    ends = set(update_ends(damping.every, len(residual.index)))
    window = [[0.0] * 5 for _ in range(world)]
    rows = []
    for k, step in enumerate(residual.index):
        n = np.asarray(sizes, dtype=float)
        compute = (a + b * n) * residual.loc[step].to_numpy()
        latest = compute.max()
        for r in range(world):
            rows.append((step, r, sizes[r], compute[r] / 1e6, (latest - compute[r]) / 1e6,
                         (latest + rest.loc[step]) / 1e6))
            w = window[r]
            w[0] += 1
            w[1] += n[r]
            w[2] += compute[r]
            w[3] += n[r] ** 2
            w[4] += n[r] * compute[r]
        if policy_runner is not None and k + 1 in ends:
            change = policy_runner.update(sizes, [WindowStats.of(w) for w in window])
            window = [[0.0] * 5 for _ in range(world)]
            if change is not None:
                sizes = change[0]
    return pd.DataFrame(rows, columns=["step", "rank", "batch_size", "compute_ms", "idle_ms",
                                       "step_ms"])


def replay_summary(replayed: pd.DataFrame) -> dict[str, float]:
    """Mean step time (ms) and idle fraction of a replay, defined as for real runs."""
    per_step = replayed.groupby("step")["step_ms"].first()
    busy = per_step.sum() * replayed["rank"].nunique()
    return {"mean_step_ms": float(per_step.mean()),
            "idle_fraction": float(replayed["idle_ms"].sum() / busy) if busy else np.nan}


def change_step(manifest: dict) -> int | None:
    """The step at which an emulated slowdown jumps (two schedule points one step apart)."""
    for worker in manifest.get("run", {}).get("workers", []):
        points = worker.get("slowdown_at") or []
        for (s0, f0), (s1, f1) in zip(points, points[1:], strict=False):
            if s1 - s0 == 1 and f1 != f0:
                return int(s1)
    return None


def evaluation_table(runs: Sequence[Run], target_loss: float) -> pd.DataFrame:
    """One row per run: scenario and policy (from a run name 'scenario.policy', else the
    whole name and the partition policy), efficiency, balance (median of step_balance after
    warm-up), idle fraction, partition changes, whether the run has an abrupt change and the
    steps to recover after it (NaN if it never settled), seconds to the target loss."""
    from hetbench.analysis.tables.runs import run_row

    rows = []
    for run in runs:
        steps = run.steps
        row = run_row(run)
        scenario, _, policy = run.name.partition(".")
        change = change_step(run.manifest)
        warmup = run.warmup_steps
        rows.append({
            "scenario": scenario, "policy": policy or row["policy"], "repeat": row["repeat"],
            "efficiency": row["efficiency"],
            "balance": float(step_balance(after_warmup(steps, warmup)).median()),
            "idle_fraction": row["idle_fraction"],
            "samples_per_s": row["samples_per_s"],
            "changes": max(0, len(run.partition_history) - 1),
            "abrupt": change is not None,
            "recovery_steps": recovery_steps(steps, change) if change is not None else np.nan,
            "time_to_loss_s": time_to_loss(steps, target_loss),
        })
    return pd.DataFrame(rows)


def replay_error(recorded: pd.DataFrame, actual: pd.DataFrame, policy: str,
                 damping: Damping | None = None, warmup_steps: int = 0) -> dict[str, float]:
    """Replay `recorded` (a run under another policy, same scenario) under `policy` and
    compare with `actual`, a real run of that policy: predicted and measured mean step
    time and idle fraction, and the relative error of the step time."""
    from hetbench.analysis.view.metrics import run_summary

    predicted = replay_summary(replay(recorded, policy, damping, warmup_steps=warmup_steps))
    measured = run_summary(actual, warmup_steps)
    return {
        "predicted_step_ms": predicted["mean_step_ms"],
        "measured_step_ms": measured["mean_step_ms"],
        "step_ms_error": predicted["mean_step_ms"] / measured["mean_step_ms"] - 1,
        "predicted_idle_fraction": predicted["idle_fraction"],
        "measured_idle_fraction": measured["idle_fraction"],
    }
