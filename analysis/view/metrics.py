"""Metrics as DESIGN.md defines them, from steps.parquet rows (one per worker and step).

Input columns: rank, step, batch_size, begin_ns, ready_ns, reduced_ns, end_ns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def with_derived(steps: pd.DataFrame) -> pd.DataFrame:
    """Adds, per row: compute_ns = ready - begin; arrival_ns = latest ready of the step;
    idle_ns = arrival - ready (idle before all-reduce); comm_ns = reduced - arrival;
    busy_ns = end - begin. A pipeline's stages (column `stage`) exchange among the ranks
    that hold the same layers, not with the other stages: the arrival is their latest, so
    a stage that finishes its exchange before a later stage is ready counts no negative
    communication (with the whole buffer all-reduced over every rank, `sync = "world"`,
    waiting for the other stages counts as communication).

    Rows whose exchange the workers did not take together (`asynchronous`: a parameter
    server's asynchronous push and pull, a local step) have no common arrival:
    their idle is the wait the aggregator measured (for the others, or for a staleness
    bound) and their communication the push and pull around it."""
    # already derived (hetbench.analysis.tables.runs.analyse_run prepares once)
    if "idle_ns" in steps.columns:
        return steps
    out = steps.copy()
    out["compute_ns"] = out["ready_ns"] - out["begin_ns"]
    together = ["step", "stage"] if "stage" in out.columns else "step"
    out["arrival_ns"] = out.groupby(together)["ready_ns"].transform("max")
    out["idle_ns"] = out["arrival_ns"] - out["ready_ns"]
    out["comm_ns"] = out["reduced_ns"] - out["arrival_ns"]
    out["busy_ns"] = out["end_ns"] - out["begin_ns"]
    if not lockstep(out):
        own = out["asynchronous"].to_numpy(dtype=bool)
        out.loc[own, "idle_ns"] = out.loc[own, "wait_ns"]
        out.loc[own, "comm_ns"] = out.loc[own, "push_ns"] + out.loc[own, "pull_ns"]
    return out


def idle_agreement(steps: pd.DataFrame) -> dict[str, float]:
    """Idle before all-reduce estimated two ways and compared, lockstep steps only: from
    instants on one clock (arrival - ready, which needs other hosts' clocks aligned) and
    from each worker's own durations (its exchange minus the step's shortest exchange, the
    straggler's, who waited for no one). Across hosts, their difference is what the clock
    alignment got wrong."""
    derived = with_derived(complete_steps(steps))
    if derived.empty or not lockstep(derived):
        return {"median_abs_diff_ms": np.nan, "p95_abs_diff_ms": np.nan}
    exchange = derived["reduced_ns"] - derived["ready_ns"]
    local = exchange - exchange.groupby(derived["step"]).transform("min")
    diff_ms = (derived["idle_ns"] - local).abs() / 1e6
    return {"median_abs_diff_ms": float(diff_ms.median()),
            "p95_abs_diff_ms": float(diff_ms.quantile(0.95))}


def lockstep(steps: pd.DataFrame) -> bool:
    """Every row's exchange was taken by all workers together (all-reduce schemes; runs
    recorded before aggregators have no `asynchronous` column and were all-reduce)."""
    return "asynchronous" not in steps.columns or not bool(steps["asynchronous"].any())


def after_warmup(steps: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    """The steps summaries count: past warm-up, and none the profiler touched (column
    `profiled`, hetbench.harness.records.collector.with_profiled)."""
    if "profiled" in steps and steps["profiled"].any():
        steps = steps[~steps["profiled"].astype(bool)]
    if warmup_steps <= 0:
        return steps
    return steps[steps["step"] >= warmup_steps]


def instrumented(steps: pd.DataFrame) -> bool:
    return bool(len(steps)) and bool((steps["ready_ns"] > 0).all())


def counted_samples(steps: pd.DataFrame) -> pd.Series:
    """Each row's samples toward throughput: its batch size, except that the stages of a
    virtual worker past the first carry the same samples
    (hetbench.harness.records.collector.with_placement) and count none."""
    if "stage" not in steps:
        return steps["batch_size"]
    return steps["batch_size"].where(steps["stage"] == 0, 0)


def run_summary(steps: pd.DataFrame, warmup_steps: int = 0) -> dict[str, float]:
    """samples/s, mean step time (ms) and idle fraction over the steps after warm-up.

    Only steps that every worker recorded count (a failed run's last flushed step may be
    missing for some workers). Under an asynchronous scheme, where workers take different
    numbers of steps, every row counts, samples are those that went into an update (a
    backup worker's dropped gradient does not) and the step time is the wall time per
    global batch of such samples."""
    if not lockstep(steps):
        return _asynchronous_summary(after_warmup(steps, warmup_steps), warmup_steps)
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty:
        return {"steps": 0, "samples_per_s": np.nan, "mean_step_ms": np.nan,
                "idle_fraction": np.nan, "compute_share": np.nan, "comm_share": np.nan}
    per_step = steps.groupby("step").agg(begin=("begin_ns", "min"), end=("end_ns", "max"))
    per_step["samples"] = counted_samples(steps).groupby(steps["step"]).sum()
    wall_s = spanned_ns(per_step["begin"], per_step["end"]) / 1e9
    summary = {
        "steps": int(len(per_step)),
        "samples_per_s": float(per_step["samples"].sum() / wall_s) if wall_s > 0 else np.nan,
        "mean_step_ms": float((per_step["end"] - per_step["begin"]).mean() / 1e6),
        "idle_fraction": np.nan,
        "compute_share": np.nan,
        "comm_share": np.nan,
    }
    if instrumented(steps):
        summary.update(busy_shares(steps))
    return summary


def loss_not_finite(steps: pd.DataFrame, measured: bool = True) -> str | None:
    """A sentence where the global loss was NaN or inf at some step (the inputs or the
    model's output held them: the timing is still measured, the training is not); None
    where it was finite throughout, or where the run measured no loss (`measured` False:
    imported traces)."""
    if not measured or steps.empty or "loss" not in steps:
        return None
    bad = np.sort(steps.loc[~np.isfinite(steps["loss"].to_numpy(float)), "step"].unique())
    if not len(bad):
        return None
    return (f"the loss was not finite (NaN or inf) at {len(bad)} of "
            f"{steps['step'].nunique()} steps, first at step {bad[0]}: the inputs or the "
            "model's output hold NaN or inf; the steps are timed, but what they trained is "
            "not a model")


def spanned_ns(begin: pd.Series, end: pd.Series, step: pd.Series | None = None) -> float:
    """The wall time the steps span: first begin to last end of each run of consecutive
    step numbers (pauses between its steps included), runs that overlap in time merged. A
    gap in the numbering, the profiler's window left out, leaves its time out too. `step`:
    each row's step (default: the index)."""
    if not len(begin):
        return 0.0
    numbers = pd.Series(begin.index if step is None else step.to_numpy(), index=begin.index)
    order = np.unique(numbers.to_numpy())
    run_of = pd.Series(np.cumsum(np.diff(order, prepend=order[0] - 1) != 1), index=order)
    runs = pd.DataFrame({"begin": begin, "end": end, "run": numbers.map(run_of)})
    spans = runs.groupby("run").agg(begin=("begin", "min"), end=("end", "max"))
    spans = spans.sort_values("begin")
    total, reach = 0, None
    for b, e in zip(spans["begin"], spans["end"], strict=True):
        if reach is None or b > reach:
            total += e - b
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return float(total)


def busy_shares(steps: pd.DataFrame) -> dict[str, float]:
    """Shares of the workers' busy time (end - begin): compute, idle (before all-reduce, or
    the measured wait), communication; the rest is unpack and apply."""
    derived = with_derived(steps)
    busy = derived["busy_ns"].sum()
    return {"idle_fraction": float(derived["idle_ns"].sum() / busy),
            "compute_share": float(derived["compute_ns"].sum() / busy),
            "comm_share": float(derived["comm_ns"].sum() / busy)}


def _asynchronous_summary(steps: pd.DataFrame, warmup_steps: int) -> dict[str, float]:
    counted = counted_samples(steps)
    used = counted[~steps["dropped"].to_numpy(dtype=bool)]
    wall_s = spanned_ns(steps["begin_ns"], steps["end_ns"], steps["step"]) / 1e9
    samples = float(used.sum())
    global_batch = float(counted.groupby(steps["rank"]).median().sum()) if len(steps) \
        else np.nan
    summary = {"steps": int(steps["step"].nunique()),
               "samples_per_s": samples / wall_s if wall_s > 0 else np.nan,
               "mean_step_ms": wall_s * 1e3 * global_batch / samples if samples else np.nan,
               "idle_fraction": np.nan, "compute_share": np.nan, "comm_share": np.nan}
    if len(steps) and instrumented(steps):
        summary.update(busy_shares(steps))
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
    """Rows of the steps that every worker of the run recorded, without the rows of the
    workers left out of a step (batch_size 0: they computed nothing and took no part in
    the exchange, harness/loop/membership.py). Where workers were left out, the rows kept get
    a column `members`, the number of workers that computed their step, so that a frame
    filtered once is recognised as complete again."""
    if steps.empty:
        return steps
    if "members" in steps.columns:
        counts = steps.groupby("step")["rank"].transform("size")
        return steps if (counts == steps["members"]).all() else \
            steps[counts == steps["members"]]
    world = steps["rank"].nunique()
    if len(steps) != world * steps["step"].nunique():  # not one row per (rank, step)
        counts = steps.groupby("step")["rank"].transform("size")
        steps = steps[counts == world]
    computing = steps["batch_size"].to_numpy() > 0
    if computing.all():
        return steps
    members = pd.Series(computing, index=steps.index).groupby(steps["step"]).transform("sum")
    return steps[computing].assign(members=members[computing].to_numpy())


PHASE_COLUMNS = ("load", "to_device", "forward", "backward", "pack", "allreduce", "unpack",
                 "apply")
# Derived per-row durations summarised beside the recorded phases.
DERIVED_COLUMNS = ("compute", "idle", "comm", "busy")


def phase_stats(steps: pd.DataFrame, warmup_steps: int = 0) -> pd.DataFrame:
    """Per worker and phase (recorded phases plus compute, idle, comm, busy), after
    warm-up: n, mean_ms, std_ms, cv, p50_ms, p95_ms, p99_ms, p95_p50, p99_p50.

    Tidy: one row per (rank, phase)."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    columns = ["rank", "phase", "n", "mean_ms", "std_ms", "cv", "p50_ms", "p95_ms", "p99_ms",
               "p95_p50", "p99_p50"]
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=columns)
    derived = with_derived(steps)
    names = [*PHASE_COLUMNS, *DERIVED_COLUMNS]
    # Per rank, one numpy pass over a (steps x phases) array: melting a million records
    # by twelve phases and grouping would cost seconds.
    rows = []
    columns_ns = [f"{p}_ns" for p in names]
    for rank, block in derived[["rank", *columns_ns]].groupby("rank"):
        values = block[columns_ns].to_numpy(dtype=np.float64) / 1e6
        p50, p95, p99 = np.percentile(values, [50, 95, 99], axis=0)
        std = values.std(axis=0, ddof=1) if len(values) > 1 else np.full(len(names), np.nan)
        rows.append(pd.DataFrame({
            "rank": rank, "phase": names, "n": len(values), "mean_ms": values.mean(axis=0),
            "std_ms": std, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
        }))
    out = pd.concat(rows, ignore_index=True)
    out["cv"] = out["std_ms"] / out["mean_ms"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["p95_p50"] = out["p95_ms"] / out["p50_ms"]
        out["p99_p50"] = out["p99_ms"] / out["p50_ms"]
    out["phase"] = pd.Categorical(out["phase"], categories=names, ordered=True)
    return out.sort_values(["rank", "phase"]).reset_index(drop=True)[columns]


def step_metrics(steps: pd.DataFrame, warmup_steps: int = 0) -> pd.DataFrame:
    """One row per step: step, samples, step_ms (latest end - earliest begin), arrival
    spread (latest - earliest ready), imbalance (max compute / mean compute - 1),
    straggler (rank that was ready last), lead_ms (its lead over the second latest),
    idle_ms (summed over workers), comm_ms (mean over workers)."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    columns = ["step", "samples", "step_ms", "spread_ms", "imbalance", "straggler", "lead_ms",
               "idle_ms", "comm_ms"]
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=columns)
    d = with_derived(steps)
    world = int(d["rank"].nunique())
    if len(d) != world * d["step"].nunique():  # workers left out of some steps
        return _step_metrics_grouped(d)[columns]
    # Complete steps have one row per worker: sorted by (step, ready) the rows reshape to
    # (steps x workers), the last column being each step's straggler.
    order = np.lexsort((d["ready_ns"].to_numpy(), d["step"].to_numpy()))

    def grid(column: str) -> np.ndarray:
        return d[column].to_numpy()[order].reshape(-1, world)

    ready, rank, compute = grid("ready_ns"), grid("rank"), grid("compute_ns")
    second = ready[:, -2] if world > 1 else ready[:, -1]
    out = pd.DataFrame({
        "step": grid("step")[:, 0],
        "samples": counted_samples(d).to_numpy()[order].reshape(-1, world).sum(axis=1),
        "step_ms": (grid("end_ns").max(axis=1) - grid("begin_ns").min(axis=1)) / 1e6,
        "spread_ms": (ready[:, -1] - ready[:, 0]) / 1e6,
        "imbalance": compute.max(axis=1) / compute.mean(axis=1) - 1.0,
        "straggler": rank[:, -1],
        "lead_ms": (ready[:, -1] - second) / 1e6,
        "idle_ms": grid("idle_ns").sum(axis=1) / 1e6,
        "comm_ms": grid("comm_ns").mean(axis=1) / 1e6,
    })
    return out[columns]


def _step_metrics_grouped(d: pd.DataFrame) -> pd.DataFrame:
    """step_metrics for steps with different numbers of workers (some left out)."""
    d = d.assign(samples=counted_samples(d)).sort_values(["step", "ready_ns"], kind="stable")
    g = d.groupby("step", sort=True)
    last = d[g.cumcount(ascending=False).to_numpy() == 0].set_index("step")
    second = d[g.cumcount(ascending=False).to_numpy() == 1].set_index("step")["ready_ns"]
    second = second.reindex(last.index).fillna(last["ready_ns"])  # a lone worker: no lead
    out = pd.DataFrame({
        "samples": g["samples"].sum(),
        "step_ms": (g["end_ns"].max() - g["begin_ns"].min()) / 1e6,
        "spread_ms": (g["ready_ns"].max() - g["ready_ns"].min()) / 1e6,
        "imbalance": g["compute_ns"].max() / g["compute_ns"].mean() - 1.0,
        "straggler": last["rank"],
        "lead_ms": (last["ready_ns"] - second) / 1e6,
        "idle_ms": g["idle_ns"].sum() / 1e6,
        "comm_ms": g["comm_ns"].mean() / 1e6,
    })
    return out.reset_index()


def worker_idle(steps: pd.DataFrame, warmup_steps: int = 0) -> pd.DataFrame:
    """Per worker: idle fraction (idle / busy time), mean idle and communication (ms)."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    columns = ["rank", "idle_fraction", "idle_mean_ms", "comm_mean_ms"]
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=columns)
    g = with_derived(steps).groupby("rank")
    out = pd.DataFrame({
        "idle_fraction": g["idle_ns"].sum() / g["busy_ns"].sum(),
        "idle_mean_ms": g["idle_ns"].mean() / 1e6,
        "comm_mean_ms": g["comm_ns"].mean() / 1e6,
    }).reset_index()
    return out[columns]


def heterogeneous_efficiency(samples_per_s: float, standalone: pd.DataFrame) -> float:
    """Achieved samples/s over the sum of each worker's standalone samples/s on its own
    slice (`standalone` columns: rank, samples_per_s). 1.0 is ideal; NaN if not measured."""
    if standalone.empty or not np.isfinite(samples_per_s):
        return float("nan")
    return float(samples_per_s / standalone["samples_per_s"].sum())
