"""The report as text: Markdown for report.md and a condensed form for the terminal.
Builds on the pure analysis functions; plots nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from hetbench.analysis.measures.stragglers import CAUSES, breakdown_lines, cause_evidence
from hetbench.analysis.measures.whatif import costs
from hetbench.analysis.render.terminal import Summary, Table
from hetbench.analysis.tables import registry
from hetbench.analysis.tables.runs import group_table, run_tables, runs_table
from hetbench.analysis.trends.persistence import compute_series
from hetbench.analysis.view.metrics import idle_agreement, loss_not_finite
from hetbench.harness.partition.policies import ADAPTIVE
from hetbench.harness.records.results import Run
from hetbench.harness.spec import profiling

FIRST_STEPS = 10


def _keep(summary: Summary | None, table: Table) -> None:
    """The table in the summary for the terminal and scripts, where one is being built."""
    if summary is not None:
        summary.add(table)


def markdown_table(frame: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub Markdown table (no extra dependency)."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:.{digits}g}"
        return str(value)

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def first_steps_table(steps: pd.DataFrame, warmup: int, n: int = FIRST_STEPS) -> pd.DataFrame:
    """'step | worker 0 | worker 1 ...': compute time (ms) of the first steps after
    warm-up, then the mean and CV rows."""
    series = compute_series(steps, warmup)
    if not series:
        return pd.DataFrame()
    wide = pd.DataFrame({f"worker {r}": s for r, s in series.items()})
    head = wide.head(n).round(3)
    head.index = head.index.astype(str)
    stats = pd.DataFrame([wide.mean(), wide.std() / wide.mean()], index=["mean", "CV"])
    out = pd.concat([head, stats.round(3)])
    out.index.name = "step"
    return out.reset_index()


def clock_lines(manifest: dict[str, Any], steps: pd.DataFrame) -> list[str]:
    """How far to trust the timestamps of workers that did not share a clock."""
    clock = manifest.get("clock") or {}
    if not clock.get("applied"):
        return []
    bound = max(max(clock[when]["uncertainty_ns"]) for when in ("start", "end")) / 1e6
    check = idle_agreement(steps)
    return [f"Clocks: workers on {len(set(w.get('clock_domain') for w in manifest['workers']))}"
            f" clocks, aligned to rank 0's (offsets measured at start and end, interpolated;"
            f" each within {bound:.3f} ms). Idle before all-reduce from the aligned instants "
            f"and from local durations differs by {check['median_abs_diff_ms']:.3f} ms "
            f"(median; p95 {check['p95_abs_diff_ms']:.3f} ms).", ""]


def membership_lines(manifest: dict[str, Any]) -> list[str]:
    """Who was left out of the run (an empty slice) and taken back, and when, from the
    partition history; nothing when every worker computed every step."""
    events, before = [], None
    for change in manifest.get("partition_history") or []:
        out = {r for r, size in enumerate(change.get("sizes") or []) if size == 0}
        if before is None:
            if out:
                events.append(f"worker(s) {sorted(out)} left out from the start")
        elif out != before:
            if left := sorted(out - before):
                events.append(f"worker(s) {left} left out at step {change['step']}")
            if back := sorted(before - out):
                events.append(f"worker(s) {back} taken back at step {change['step']}")
        before = out
    return [f"**Membership**: {'; '.join(events)}.", ""] if events else []


def profile_lines(run: dict[str, Any]) -> list[str]:
    """Where a run with a `profile` window left its torch.profiler traces, and which steps
    its numbers leave out for them (harness/spec/profiling.py)."""
    window = run.get("profile")
    if not window:
        return []
    return [f"**Profiled**: {profiling.describe(window)}, torch.profiler "
            "traces in the run's `profile/` (Holistic Trace Analysis reads the folder); steps "
            f"{window['first']}-{window['last'] + 1} are left out of every number below.", ""]


def job_lines(manifest: dict[str, Any]) -> list[str]:
    """A workload named by import path: the user's job, its data, and how exact its slices
    were measured to be before training (harness/loop/exactness.py)."""
    job, exact = manifest.get("job"), manifest.get("exactness")
    if not isinstance(job, dict):
        return []
    train = job.get("train") or {}
    project = job.get("project") or {}
    git = project.get("git") or {}
    code = (f"; {project.get('package')} at {str(git['commit'])[:12]}"
            + (" (dirty tree)" if git.get("dirty") else "") if git.get("commit") else "")
    own = job.get("optimizer")
    optimizer = (f"; its own optimizer {str(own.get('type')).rsplit('.', 1)[-1]} (lr "
                 f"{own.get('lr')})" if isinstance(own, dict) else "")
    lines = [f"**Job**: `{job.get('factory')}` ({job.get('model')}, {job.get('parameters')} "
             f"parameters, loss reduced by {job.get('reduction')}{optimizer}){code}; data "
             f"{train.get('source') or train.get('type')}, {train.get('samples')} samples, "
             f"fingerprint {train.get('fingerprint')}.", ""]
    cut = "micro-batches" if isinstance(exact, dict) and exact.get("micro_batches") \
        else "slices"
    if isinstance(exact, dict) and exact.get("max_relative_difference") is None:
        lines += [f"**Exactness** of the {cut} {exact.get('sizes')} of step "
                  f"{exact.get('step')}'s global batch: {exact.get('reason')}.", ""]
    elif isinstance(exact, dict):
        without = exact.get("without_dropout")
        lines += [f"**Exactness**: the {cut} {exact.get('sizes')} of step "
                  f"{exact.get('step')}'s global batch sum to its gradient within "
                  f"{exact.get('max_relative_difference', float('nan')):.2g} of its largest "
                  "element" + ("" if without is None else f" ({without:.2g} with dropout "
                                                          "off)")
                  + f": {exact.get('reason')}.", ""]
    end = exact.get("at_end") if isinstance(exact, dict) else None
    if isinstance(end, dict) and end.get("max_relative_difference") is not None:
        lines[-1:-1] = [f"On the slices {end.get('sizes')} it ended with (an adaptive policy "
                        f"moved them): within {end['max_relative_difference']:.2g}."]
    return lines


def run_section(recorded: Run, failslow: list[dict[str, Any]] | None = None) -> list[str]:
    """The run's part of report.md; its fail-slow detections appended to `failslow`."""
    manifest, steps, run = recorded.manifest, recorded.steps, recorded.spec
    warmup = recorded.warmup_steps
    title = f"### {manifest.get('run_id', '?')}"
    lines = [title, "",
             f"status **{manifest.get('status')}**"
             + (f" ({manifest.get('reason')})" if manifest.get("reason") else "")
             + f"; heterogeneity {manifest.get('heterogeneity', '?')}; "
             f"{run.get('workload')}/{run.get('dataset')}, batch {run.get('global_batch')}, "
             f"partition {run.get('partition', {}).get('policy')} "
             f"{(manifest.get('partition_history') or [{}])[0].get('sizes', '')}; "
             f"{len(steps['step'].unique()) if len(steps) else 0} steps recorded, "
             f"{warmup} warm-up", ""]
    if (demand := manifest.get("load") or {}).get("oversubscribed"):
        busy = f" computing on {demand['cpu_demand']:g}" if "cpu_demand" in demand else ""
        lines += [f"**Oversubscribed**: {demand['worker_threads']} worker threads{busy} of "
                  f"{demand['cores']} cores (load average {demand['load_average_1m']} at "
                  "start): every timing includes waiting for a core.", ""]
    if (not_finite := loss_not_finite(steps, "imported" not in manifest)) is not None:
        lines += [f"**Warning**: {not_finite}.", ""]
    lines += job_lines(manifest)
    lines += clock_lines(manifest, steps) + membership_lines(manifest) + profile_lines(run)
    table = first_steps_table(steps, warmup)
    if table.empty:
        return [*lines, "No instrumented steps to analyse.", ""]
    lines += ["Compute time per batch (ms):", "", markdown_table(table), ""]
    # The tables come from analyse_run, the path the 1M-record benchmark times.
    tables = run_tables(recorded)
    stats = tables["phases"]
    main = stats[stats["phase"].isin(["compute", "idle", "comm", "forward", "backward"])]
    lines += ["Per worker and phase (ms):", "",
              markdown_table(main[["rank", "phase", "mean_ms", "cv", "p50_ms", "p95_p50",
                                   "p99_p50"]]), ""]
    lines += ["Idle before all-reduce:", "", markdown_table(tables["idle"]), ""]
    shares = tables["causes"]
    lines += ["Stragglers (ready last):", "",
              markdown_table(tables["stragglers"]), "",
              "Straggler excess over the worker's own median compute time (across hosts, "
              "plus the exchange a slower link lengthened: network), by cause "
              "(rank -1: all workers):", "",
              markdown_table(shares.pivot(index="rank", columns="cause", values="share")
                             .reset_index()), ""]
    lines += [f"- {line}" for line in cause_evidence(tables["attribution"])] + [""]
    lines += ["Where each worker's compute went (shares of its compute time; the main "
              "thread's on a CPU, waiting for one, blocked; the emulated stretch; the "
              "garbage collector):", "", markdown_table(tables["breakdown"]), ""]
    lines += breakdown_lines(tables["breakdown"]) + [""]
    acf = tables["autocorrelation"]
    lines += ["Persistence (autocorrelation of compute time by lag):", "",
              markdown_table(acf.pivot(index="rank", columns="lag", values="acf")
                             .reset_index()), ""]
    cps = tables["change_points"]
    lines += ["Change points: " + ("none" if cps.empty else ""), ""]
    if not cps.empty:
        lines += [markdown_table(cps), ""]
    lines += failslow_lines(tables["failslow"])
    if failslow is not None:
        from hetbench.analysis.trends.failslow import describe

        failslow += [{"run_id": manifest.get("run_id", "?"), "detected": describe(r)}
                     for r in tables["failslow"].itertuples()]
    if run.get("pipeline"):  # the what-if re-slices a data-parallel batch
        return lines
    what = tables["what_if"]
    c = costs(what)
    lines += ["What-if (total time of the measured steps):", "", markdown_table(what), "",
              f"Variability costs **{c['cost_of_variability']:.1%}** beyond the mean "
              f"imbalance, which itself costs {c['cost_of_imbalance']:.1%} over a balanced "
              "partition; every worker at the fastest one's per-sample rate would save "
              f"{c['cost_of_heterogeneity']:.1%} over the medians.", ""]
    return lines


def causes_section(runs: Sequence[Run], summary: Summary | None = None) -> list[str]:
    """Why the stragglers were late, over every run: the largest causes of straggler excess
    pooled over the runs (a headline line), and each run's shares by cause."""
    rows = []
    for run in runs:
        if run.spec.get("pipeline"):
            continue
        shares = run_tables(run)["causes"]
        everyone = shares[shares["rank"] == -1].set_index("cause")
        if everyone.empty or not everyone["excess_ms"].sum() > 0:
            continue
        rows.append({"run_id": run.run_id, "excess_ms": everyone["excess_ms"].sum(),
                     **everyone["share"].where(everyone["share"] > 0).to_dict()})
    if not rows:
        return []
    table = pd.DataFrame(rows)
    causes = [c for c in CAUSES if c in table]
    pooled = (table[causes].fillna(0.0).mul(table["excess_ms"], axis=0).sum()
              / table["excess_ms"].sum()).sort_values(ascending=False)
    largest = ", ".join(f"{cause} {share:.0%}" for cause, share in pooled.items()
                        if share >= 0.05) or "none above 5%"
    line = (f"Straggler excess (the time the last worker lost beyond its typical compute), "
            f"by cause over the {len(table)} runs: {largest}; unexplained "
            f"{pooled.get('unexplained', 0.0):.0%} (median run "
            f"{table['unexplained'].fillna(0.0).median() if 'unexplained' in table else 0:.0%}).")
    if summary is not None:
        summary.headline.append(line)
        _keep(summary, Table("Straggler excess by cause (share of each run's, all workers)",
                             table[["run_id", "excess_ms", *causes]], ("run_id",)))
    return ["## Why the stragglers were late", "", line, "",
            markdown_table(table[["run_id", "excess_ms", *causes]]), ""]


def failslow_lines(found: pd.DataFrame) -> list[str]:
    from hetbench.analysis.trends.failslow import MIN_FACTOR, PERSIST, describe

    if found.empty:
        return [f"Fail-slow: none (no worker's time per sample moved {MIN_FACTOR:g}x or more "
                f"and held {PERSIST} steps).", ""]
    return ["Fail-slow: " + "; ".join(describe(r) for r in found.itertuples()) + ".", ""]


def failslow_section(runs: Sequence[Run], summary: Summary | None = None) -> list[str]:
    """The fail-slow detector against the emulated schedules, when some run has one."""
    from hetbench.analysis.trends.failslow import MIN_FACTOR, PERSIST
    from hetbench.analysis.trends.failslow_check import scheduled, suite_check

    if not any(scheduled(run.manifest) for run in runs):
        return []
    table, s = suite_check(runs)
    if summary is not None:
        summary.headline.append(failslow_headline(s))
    return ["## Fail-slow detection against the emulated schedules", "",
            failslow_headline(s), "",
            "Per emulated episode (a `slowdown_at` jump or drift of at least "
            f"{MIN_FACTOR:g}x), and per worker whose detections match none: what the "
            "detector (analysis/trends/failslow.py) reported, the error in the step and factor "
            "(detected / emulated - 1; `per sample`: read where the slice changed, so it "
            "includes the fixed cost per step), and the delay: steps after the jump, or "
            f"after a drift reached {MIN_FACTOR:g}x, until the detector run on the steps "
            f"recorded so far reports it (a shift must hold {PERSIST} steps).", "",
            markdown_table(table), ""]


def failslow_headline(s: dict[str, float]) -> str:
    return (f"Fail-slow detection: {s['found']}/{s['episodes']} emulated slowdowns found, "
            f"step error {s['step_error_median']:.3g} (median of jumps), delay "
            f"{s['delay_median']:.3g} steps (median; at most {s['delay_max']:.3g}), factor "
            f"error {s['factor_error_median']:.1%} (median, at equal slice); false alarms: "
            f"{s['steady_runs_alarmed']} of {s['steady_runs']} steady runs, "
            f"{s['false_alarms_scheduled']} on runs with a schedule.")


def side_by_side(by_setup: pd.DataFrame, setup_keys: list[str]) -> pd.DataFrame:
    """group_table rows as one row per metric and one column per setup, "mean [low, high]";
    a column is named by the setup keys that differ between setups."""
    if by_setup.empty:
        return by_setup
    varying = [k for k in setup_keys if by_setup[k].nunique() > 1] or setup_keys[:1]
    label = by_setup[varying].astype(str).agg(" / ".join, axis=1)

    def cell(row: pd.Series) -> str:
        if math.isnan(row["ci_low"]):
            return f"{row['mean']:.3g}"
        return f"{row['mean']:.3g} [{row['ci_low']:.3g}, {row['ci_high']:.3g}]"

    wide = pd.DataFrame({"metric": by_setup["metric"].to_numpy(), "setup": label.to_numpy(),
                         "cell": by_setup.apply(cell, axis=1).to_numpy()})
    out = wide.pivot(index="metric", columns="setup", values="cell").reset_index()
    out.columns.name = None
    return out


def repartition_section(runs: Sequence[Run], target_loss: float,
                        summary: Summary | None = None) -> list[str]:
    """Scenario x policy: efficiency, idle, recovery and time to a target loss, over repeats
    (only when some run repartitions or changes its emulated slowdown)."""
    from hetbench.analysis.tables.repartition import evaluation_table

    def moves(run: dict[str, Any]) -> bool:
        return run.get("partition", {}).get("policy") in ADAPTIVE or any(
            w.get("slowdown_at") for w in run.get("workers", []))

    if not any(moves(run.manifest.get("run", {})) for run in runs):
        return []
    table = evaluation_table(runs, target_loss)
    metrics = ["efficiency", "balance", "idle_fraction", "changes", "recovery_steps",
               "time_to_loss_s"]
    groups = table.groupby(["scenario", "policy"], sort=False)
    by_policy = groups[metrics].agg(["mean", "std"])
    by_policy.columns = [f"{m} {stat}" for m, stat in by_policy.columns]
    by_policy.insert(0, "repeats", groups.size())
    # The mean recovery leaves out repeats that never settled: say how many did.
    settled = groups["recovery_steps"].agg(lambda r: int(r.notna().sum()))
    by_policy.insert(by_policy.columns.get_loc("recovery_steps mean"), "settled",
                     [f"{n}/{size}" if abrupt else "" for n, size, abrupt in
                      zip(settled, groups.size(), groups["abrupt"].any(), strict=True)])
    _keep(summary, Table("Repartitioning (mean and standard deviation over repeats)",
                      by_policy.reset_index(), ("scenario", "policy")))
    return ["## Repartitioning", "",
            "Per scenario and policy, mean and standard deviation over repeats: "
            "heterogeneous efficiency, balance (per step, mean compute / slowest compute; "
            "median after warm-up), idle fraction, partition changes, steps after an abrupt "
            "change until the balance (centred 10-step median) is back within 5% of its "
            "steady level and holds for 20 steps (`settled`: repeats where it did; the "
            "mean is over those), seconds to a rolling loss of "
            f"{target_loss:g}.", "",
            markdown_table(by_policy.reset_index()), ""]


def aggregator_section(table: pd.DataFrame, summary: Summary | None = None) -> list[str]:
    """Communication time per aggregator (torch.distributed, parameter servers, the
    frameworks' native ones), only when the runs use more than one."""
    if table.empty or table["aggregator"].nunique() < 2:
        return []
    groups = group_table(table, by=["framework", "aggregator"],
                         metrics=["comm_p50_ms", "comm_p95_ms", "mean_step_ms"])
    wide = groups.pivot_table(index=["framework", "aggregator"], columns="metric",
                              values="mean").reset_index()
    wide.insert(2, "repeats", groups.groupby(["framework", "aggregator"])["n"].max().to_numpy())
    _keep(summary, Table("Communication by aggregator (ms, mean over repeats)", wide,
                      ("framework", "aggregator")))
    return ["## Communication by aggregator", "",
            "Communication after the last arrival (reduced - arrival, idle excluded), median "
            "and p95 over workers and steps, mean over repeats (ms).", "",
            markdown_table(wide), ""]


def schemes_section(runs: Sequence[Run],
                    summary: Summary | None = None) -> list[str]:
    """Hardware against statistical efficiency per synchronisation scheme, and the
    staleness of their updates; only when the runs compare schemes."""
    from hetbench.analysis.tables.schemes import (
        SCHEME_METRICS,
        compares_schemes,
        scheme_groups,
        scheme_table,
        staleness_counts,
        staleness_summary,
    )

    if not compares_schemes(runs):
        return []
    groups = scheme_groups(scheme_table(runs))
    if groups.empty:
        return []

    def cell(row: pd.Series) -> str:
        if math.isnan(row["ci_low"]):
            return f"{row['mean']:.3g}"
        return f"{row['mean']:.3g} ± {row['ci_high'] - row['mean']:.2g}"

    cells = groups.assign(cell=groups.apply(cell, axis=1))
    view = cells.pivot(index="run", columns="metric", values="cell")
    first = groups.groupby("run", sort=False)[["aggregator", "bound", "repeats", "reached"]]\
        .first()
    view = pd.concat([first, view.reindex(first.index)[[m for m in SCHEME_METRICS
                                                        if m in view.columns]]], axis=1)
    view["reached"] = [f"{int(r.reached)}/{int(r.repeats)}" for r in first.itertuples()]
    order = list(dict.fromkeys(run.manifest.get("run", {}).get("name", "") for run in runs))
    view = view.drop(columns="repeats").reindex([r for r in order if r in view.index])
    view = view.reset_index()
    staleness = staleness_summary(staleness_counts(runs))
    _keep(summary, Table("Synchronisation schemes: hardware against statistical efficiency "
                      "(mean ± 95% over repeats)", view))
    return ["## Synchronisation schemes: hardware against statistical efficiency", "",
            "Per scheme, mean ± 95% t half-interval over repeats: samples/s into updates and "
            "idle fraction (hardware), mean staleness of the updates and share of computed "
            "gradients dropped, steps and training seconds to the held-out target over the "
            "repeats that reached it (statistical). `bound`: how stale an update may be (ssp: "
            "s; local SGD: H - 1 local steps; ps-async: inf).", "",
            markdown_table(view), "",
            "### Staleness of the updates", "",
            "Server version when an update was applied minus the version its gradient was "
            "computed on, over every repeat's updates after warm-up (ps-async and ssp count "
            "single pushes, so a lockstep round of n workers already shows 0 to n - 1).", "",
            markdown_table(staleness), ""]


def convergence_section(runs: Sequence[Run],
                        summary: Summary | None = None) -> list[str]:
    """Held-out metric and time to target per run name, over repeats."""
    from hetbench.analysis.tables.convergence import convergence_groups, convergence_table

    table = convergence_table(runs)
    if table.empty:
        return []
    groups = convergence_groups(table)
    wide = groups.pivot(index="run", columns="metric", values="mean")
    ci = (groups.assign(ci=groups["ci_high"] - groups["mean"])
          .pivot(index="run", columns="metric", values="ci"))
    counts = groups.groupby("run")[["repeats", "reached"]].max()
    first = table.groupby("run", sort=False)[["metric", "target_metric", "target"]].first()
    view = pd.DataFrame({"run": first.index})
    view["target"] = [f"{r.target_metric} {'<=' if r.target_metric == 'loss' else '>='} "
                      f"{r.target:g}" if r.target_metric else "" for r in first.itertuples()]
    view["reached"] = [f"{int(counts.loc[r, 'reached'])}/{int(counts.loc[r, 'repeats'])}"
                       for r in first.index]
    for metric in ("time_to_target_s", "steps_to_target", "final_metric", "final_loss"):
        view[metric] = wide[metric].reindex(first.index).to_numpy() if metric in wide else math.nan
        view[f"{metric} ±95%"] = (ci[metric].reindex(first.index).to_numpy() if metric in ci
                                  else math.nan)
    view.insert(1, "metric", first["metric"].to_numpy())
    _keep(summary, Table("Time to target (held-out; mean over the repeats that reached it)",
                      view))
    return ["## Time to target (held-out)", "",
            "First held-out evaluation at which the run's target is reached: training "
            "seconds (evaluations excluded) and steps; mean and 95% t interval over the "
            "repeats that reached it. Final values: the last evaluation.", "",
            markdown_table(view), ""]


def table_section(heading: str, table: pd.DataFrame, explanation: str,
                  summary: Summary | None = None, keys: tuple[str, ...] = ("run",)) -> list[str]:
    """A report section of one table and what its columns mean (the table also in the
    summary); none for an empty table."""
    if table.empty:
        return []
    _keep(summary, Table(heading, table, keys))
    return [f"## {heading}", "", explanation, "", markdown_table(table), ""]


def pipeline_section(runs: Sequence[Run],
                     summary: Summary | None = None) -> list[str]:
    """Per stage of each pipelined run: measured against predicted time per micro-batch,
    and the bubble; only when some run pipelined its model."""
    from hetbench.analysis.measures.pipeline import pipeline_summary, pipeline_table

    return table_section(
        "Pipelines (virtual workers)", pipeline_summary(pipeline_table(runs)),
        "Per stage: its layers, the partitioner's predicted and the measured forward + "
        "backward time of one micro-batch (median over waves after warm-up; error = "
        "measured / predicted - 1), and the bubble fraction: the share of the schedule's "
        "span the stage spent waiting for activations or gradients, or sending them "
        "(mean over waves; ideal_bubble: GPipe's (S - 1) / (Nm + S - 1) for equal "
        "stages); each the mean over repeats, layers the split chosen most often.", summary)


def placement_section(runs: Sequence[Run],
                      summary: Summary | None = None) -> list[str]:
    """Bytes on the wire per step under each layer placement on the parameter servers;
    only when some run placed layers."""
    from hetbench.analysis.measures.traffic import traffic_summary, traffic_table

    return table_section(
        "Layer placement on the parameter servers",
        traffic_summary(traffic_table(runs)),
        "MB of tensors on the wire per step (sent + received), per worker (mean, and "
        "the busiest) and per server (mean, and the busiest: the one every step waits "
        "for), with the mean step time and samples/s after warm-up; means over repeats. "
        "data-parallel: tensors dealt round-robin over the servers; sharded: contiguous "
        "shards balanced by bytes; fc-on-server: the fully connected layers computed on "
        "the last server, their activations and gradients on the wire instead of their "
        "weights.", summary)


def network_section(runs: Sequence[Run],
                    summary: Summary | None = None) -> list[str]:
    """Each worker's exchange bandwidth against the slowest link it crosses; only when some
    run spans hosts (its manifest's `nodes`)."""
    from hetbench.analysis.measures.network import bandwidth_summary, bandwidth_table

    return table_section(
        "Network: exchange bandwidth per node",
        bandwidth_summary(bandwidth_table(runs)),
        "Per run and worker, by the node (host) that ran it: the rate of the slowest "
        "link its exchange crosses (its host's; an all-reduce's every host's; a parameter "
        "server's host's), as the suite described it (Mbit/s; blank: one not described), "
        "MB one exchange moved over its host's link (all-reduce: 2(n - 1)/n x the "
        "gradient buffer, what every worker sends in a ring and the least a symmetric "
        "all-reduce sends; parameter servers: the tensors sent to and received from "
        "servers on other hosts), the median exchange time (push + pull, or the "
        "communication after the last arrival: the wait for the straggler left out), "
        "the bandwidth that achieved and its share of that rate; means over repeats "
        "(analysis/measures/network.py).", summary)


def build(runs: Sequence[Run], figures: Sequence[str] = (), target_loss: float = 0.5
          ) -> tuple[str, Summary]:
    """(report.md text, the summary for the terminal and scripts) for the runs: their
    steps, held-out evaluations and micro-batches."""
    table = runs_table(runs)
    kinds = sorted(set(table["heterogeneity"])) if len(table) else []
    overview = table[RUNS_COLUMNS]
    groups = group_table(table, by=["run"])
    group_view = _group_view(groups, GROUP_METRICS)
    summary = Summary(headline=overall_headline(table, groups))
    for title, metrics in TERMINAL_TOPICS:
        _keep(summary, Table(title, _group_view(groups, metrics)))
    md = ["# hetbench report", "",
          f"{len(table)} run(s); heterogeneity: {', '.join(kinds)}. Partial runs (fewer "
          "steps than planned: failed or interrupted) are reported for the steps they have.",
          "", "## What variability costs", "", *summary.headline, "", *_headline(groups), "",
          "## Runs", "", markdown_table(overview), "",
          "## Across repeats (mean and 95% t interval over repeats)", "",
          markdown_table(group_view), "", "Definitions (analysis/tables/registry.py):", "",
          *registry.definitions(list(dict.fromkeys([*overview.columns, *GROUP_METRICS]))),
          ""]
    setup_keys = ["framework", "aggregator", "workload", "policy", "devices"]
    by_setup = group_table(table, by=setup_keys)
    by_setup = by_setup[by_setup["metric"].isin(["compute_cv_max", "compute_p99_p50_max",
                                                  "idle_fraction", "cost_of_variability"])]
    md += ["## By framework, aggregation, workload, partition and devices", "",
           "Does the same variability occur across setups? Mean over runs and repeats "
           "[95% t interval], one column per setup.", "",
           markdown_table(side_by_side(by_setup, setup_keys)), ""]
    md += aggregator_section(table, summary)
    md += schemes_section(runs, summary)
    md += convergence_section(runs, summary)
    md += repartition_section(runs, target_loss, summary)
    md += pipeline_section(runs, summary)
    md += placement_section(runs, summary)
    md += network_section(runs, summary)
    md += failslow_section(runs, summary)
    md += causes_section(runs, summary)
    if figures:
        md += ["## Figures", ""] + [f"![{f}]({f})" for f in figures] + [""]
    md += ["## Each run", ""]
    detected: list[dict[str, Any]] = []
    for run in runs:
        md += run_section(run, detected)
    _keep(summary, Table("Fail-slow: workers that became slower and stayed so "
                      "(analysis/trends/failslow.py)", pd.DataFrame(detected), ("run_id",)))
    return "\n".join(md), summary


# The report's runs table: a run's identity, then metrics of the registry by name
RUNS_COLUMNS = ["run_id", "status", "partial", "oversubscribed", "heterogeneity",
                "samples_per_s", "idle_fraction", "efficiency", "oracle_efficiency",
                "compute_cv_max", "cost_of_variability", "cost_of_imbalance"]
GROUP_METRICS = ["samples_per_s", "compute_share", "comm_share", "idle_fraction", "efficiency",
                 "oracle_efficiency", "compute_cv_max", "residual_cv_max",
                 "compute_p99_p50_max", "cost_of_variability"]
# The terminal's per-run tables, by topic, each narrow enough for 100 columns
TERMINAL_TOPICS = [
    ("Throughput (mean ± 95% t interval over repeats)",
     ["samples_per_s", "idle_fraction", "efficiency", "oracle_efficiency"]),
    ("Where the time goes and what variability costs",
     ["compute_share", "comm_share", "cost_of_variability", "cost_of_imbalance"]),
    ("Variability of compute time (the most variable worker)",
     ["compute_cv_max", "residual_cv_max", "compute_p99_p50_max"]),
]


def _group_view(groups: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """One row per run name: repeats, and each metric's mean and 95% half-interval."""
    order = list(dict.fromkeys(groups["run"]))
    wide = groups.pivot(index="run", columns="metric", values="mean").reindex(order)
    ci = (groups.assign(ci=groups["ci_high"] - groups["mean"])
          .pivot(index="run", columns="metric", values="ci").reindex(order))
    n = groups.groupby("run", sort=False)["n"].max()
    view = pd.DataFrame({"run": wide.index, "repeats": n.reindex(wide.index).to_numpy()})
    for metric in metrics:
        if metric in wide:
            view[metric] = wide[metric].to_numpy()
            view[f"{metric} ±95%"] = ci[metric].to_numpy() if metric in ci else math.nan
    return view


def overall_headline(table: pd.DataFrame, groups: pd.DataFrame) -> list[str]:
    """What the suite found, in a few sentences: how many runs, what variability and the
    imbalance cost at the least and most, the fastest and slowest configuration, and the
    runs whose numbers need care (not completed, oversubscribed)."""
    if table.empty:
        return ["No runs."]
    repeats = groups.groupby("run")["n"].max() if len(groups) else pd.Series(dtype=int)
    low, high = (int(repeats.min()), int(repeats.max())) if len(repeats) else (1, 1)
    lines = [f"{len(table)} run(s): {table['run'].nunique()} configuration(s) x "
             + (f"{low}" if low == high else f"{low}-{high}") + " repeat(s)"
             + (" (one repeat: no intervals)." if high == 1 else ".")]
    means = groups.pivot(index="run", columns="metric", values="mean") if len(groups) else \
        pd.DataFrame()
    if "cost_of_variability" in means and means["cost_of_variability"].notna().any():
        v, i = means["cost_of_variability"].dropna(), means["cost_of_imbalance"].dropna()
        lines.append(f"Variability costs {_span(v)} beyond the mean imbalance; the "
                     f"imbalance costs {_span(i)} over a balanced partition.")
    if "samples_per_s" in means and means["samples_per_s"].notna().any():
        rate = means["samples_per_s"].dropna()
        lines.append(f"Fastest: {rate.idxmax()}, {rate.max():.3g} samples/s; slowest: "
                     f"{rate.idxmin()}, {rate.min():.3g} samples/s.")
    unfinished = table[table["status"] != "completed"]
    if len(unfinished):
        lines.append(f"Not completed ({len(unfinished)}): " + ", ".join(
            f"{r.run_id} {r.status}" for r in unfinished.itertuples()) + ".")
    crowded = table[table["oversubscribed"].fillna(False).astype(bool)]
    if len(crowded):
        lines.append(f"Oversubscribed ({len(crowded)} of {len(table)}): more worker threads "
                     "than cores, so their timings include waiting for a core.")
    return lines


def _span(values: pd.Series) -> str:
    """'1.5% (natural.x) to 6.7% (drift.y)', or one value."""
    if len(values) == 1:
        return f"{values.iloc[0]:.1%}"
    return (f"{values.min():.1%} ({values.idxmin()}) to {values.max():.1%} "
            f"({values.idxmax()})")


def _headline(groups: pd.DataFrame) -> list[str]:
    """One sentence per run name: the cost of variability beyond the mean imbalance."""
    lines = []
    for run, g in groups.groupby("run", sort=False):
        m = g.set_index("metric")
        if "cost_of_variability" not in m.index:
            continue
        v, i = m.loc["cost_of_variability"], m.loc["cost_of_imbalance"]
        if math.isnan(v["mean"]):  # a pipelined run: no data-parallel what-if
            continue
        spread = (f" (95% interval ±{v['ci_high'] - v['mean']:.1%} over {int(v['n'])} repeats)"
                  if v["n"] > 1 else " (one repeat: no interval)")
        lines.append(f"- {run}: variability costs {v['mean']:.1%}{spread} beyond the mean "
                     f"imbalance, which costs {i['mean']:.1%} over a balanced partition.")
    return lines
