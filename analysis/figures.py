"""Figures (the only module that plots), as PNG and PDF. Each figure's title says which
runs it shows and whether heterogeneity was real or emulated; axes carry units.

Inputs are (manifest, steps) pairs, as harness.results.load_run gives them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.deviceclass import short_name
from analysis.metrics import (
    PHASE_COLUMNS,
    after_warmup,
    complete_steps,
    instrumented,
    phase_stats,
    with_derived,
)
from analysis.repartition import slices_over_steps
from analysis.runs import runs_table, slowdowns
from analysis.stragglers import attribute, cause_shares, straggler_summary
from analysis.whatif import what_if

Runs = Sequence[tuple[dict[str, Any], pd.DataFrame]]
# (manifest, steps, micro-batches) of pipelined runs (analysis/pipeline.py)
Pipelines = Sequence[tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]]
MAX_TIMELINES = 6  # panels of the pipeline timeline figure


def _label(manifest: dict[str, Any]) -> str:
    """A panel's title: the run's name and repeat (the run id's timestamp tells a reader
    nothing), and whether its heterogeneity was real or emulated."""
    name = manifest.get("run", {}).get("name") or manifest.get("run_id", "?")
    return f"{name} r{manifest.get('repeat', 0)} ({manifest.get('heterogeneity', '?')})"


def _warmup(manifest: dict[str, Any]) -> int:
    return int(manifest.get("run", {}).get("warmup_steps", 0))


def _scope(runs: Runs) -> str:
    kinds = sorted({m.get("heterogeneity", "?") for m, _ in runs})
    suites = sorted({m.get("suite", {}).get("name", "?") for m, _ in runs})
    return f"{len(runs)} run(s) of {', '.join(suites)}; heterogeneity: {', '.join(kinds)}"


def per_run_frame(runs: Runs, build: Callable[[dict[str, Any], pd.DataFrame], pd.DataFrame]
                  ) -> pd.DataFrame:
    parts = []
    for manifest, steps in runs:
        if len(steps) and instrumented(after_warmup(steps, _warmup(manifest))):
            frame = build(manifest, steps)
            if len(frame):
                parts.append(frame.assign(run=_label(manifest)))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def worker_names(manifest: dict[str, Any], ranks: pd.Series) -> pd.Series:
    """Legend entries: the rank and what the worker is ('1 cpu-3x', '0 cuda'), not 'worker 1'."""
    workers = manifest.get("run", {}).get("workers") or []
    names = {r: f"{r} {short_name(w)}" for r, w in enumerate(workers) if isinstance(w, dict)}
    return ranks.map(lambda r: names.get(int(r), str(r))).astype(str)


def compute_frame(manifest: dict[str, Any], steps: pd.DataFrame) -> pd.DataFrame:
    d = with_derived(complete_steps(after_warmup(steps, _warmup(manifest))))
    return pd.DataFrame({"worker": worker_names(manifest, d["rank"]), "step": d["step"],
                         "compute_ms": d["compute_ns"] / 1e6, "idle_ms": d["idle_ns"] / 1e6})


# The all-reduce phase is shown as its two parts: idle (waiting for the last worker) and
# communication (after the last worker arrived).
BREAKDOWN = tuple(p for p in PHASE_COLUMNS if p != "allreduce") + ("idle", "comm", "bubble")


def phase_frame(manifest: dict[str, Any], steps: pd.DataFrame) -> pd.DataFrame:
    stats = phase_stats(steps, _warmup(manifest))
    stats = stats[stats["phase"].isin(BREAKDOWN)]
    phase = stats["phase"].astype(str)
    if (manifest.get("run") or {}).get("pipeline"):  # a stage's pack slot holds its bubble
        phase = phase.replace("pack", "bubble")
    return stats.assign(worker=worker_names(manifest, stats["rank"]), phase=phase)


def cause_frame(manifest: dict[str, Any], steps: pd.DataFrame) -> pd.DataFrame:
    warmup = _warmup(manifest)
    shares = cause_shares(attribute(steps, warmup, slowdowns(manifest), manifest=manifest))
    shares = shares[shares["rank"] >= 0]
    last = straggler_summary(steps, warmup).set_index("rank")["share_last"]
    shares = shares.assign(worker=worker_names(manifest, shares["rank"]),
                           share_last=shares["rank"].map(last))
    # Each cause's part of all steps: share of steps last x share of its excess.
    shares["part"] = shares["share"].fillna(0) * shares["share_last"]
    return shares


def slices_frame(manifest: dict[str, Any], steps: pd.DataFrame) -> pd.DataFrame:
    frame = slices_over_steps(steps)
    return frame.assign(worker=worker_names(manifest, frame["rank"]))


def whatif_frame(manifest: dict[str, Any], steps: pd.DataFrame) -> pd.DataFrame:
    if (manifest.get("run") or {}).get("pipeline"):  # no data-parallel batch to re-slice
        return pd.DataFrame()
    return what_if(steps, _warmup(manifest), manifest)


def _save(figure: Any, out: Path, name: str) -> list[Path]:
    import matplotlib.pyplot as plt

    # TrueType (42), not Type 3, fonts in the PDF: what journals' submission checks ask for
    plt.rcParams["pdf.fonttype"] = 42
    plt.rcParams["ps.fonttype"] = 42

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    try:
        for path in paths:
            try:
                figure.savefig(path, bbox_inches="tight", dpi=120)
            except OSError as exc:  # Pillow's name no file: say which (a full disk)
                raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    finally:
        plt.close(figure)
    return paths


def _workers(frame: pd.DataFrame) -> list[str]:
    return sorted(frame["worker"].unique(), key=lambda name: int(name.split()[0]))


def _facets(frame: pd.DataFrame) -> dict[str, Any]:
    n = frame["run"].nunique()
    return {"col": "run", "col_wrap": min(3, n), "height": 2.8, "aspect": 1.4}


def write_all(runs: Runs, out: Path, evals: Runs = (), micro: Pipelines = ()) -> list[Path]:
    """Every figure that the runs have data for; returns the files written. `evals`: the
    runs' held-out evaluations as (manifest, eval frame); `micro`: their micro-batch records
    as (manifest, steps, micro-batches), for the pipeline timeline."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    scope = _scope(runs)
    paths: list[Path] = []
    compute = per_run_frame(runs, compute_frame)
    if len(compute):
        grid = sns.relplot(data=compute, x="step", y="compute_ms", hue="worker", kind="line",
                           linewidth=0.8, facet_kws={"sharey": False}, **_facets(compute))
        grid.set_axis_labels("step", "compute time per batch (ms)")
        grid.set_titles("{col_name}", size=8)
        grid.figure.suptitle(f"Per-batch compute time per worker — {scope}", y=1.02, size=10)
        paths += _save(grid.figure, out, "compute_per_step")

        grid = sns.displot(data=compute, x="idle_ms", hue="worker", kind="ecdf",
                           facet_kws={"sharex": False}, **_facets(compute))
        grid.set_axis_labels("idle before all-reduce (ms)", "share of steps")
        grid.set_titles("{col_name}", size=8)
        grid.figure.suptitle(f"ECDF of idle time before all-reduce — {scope}", y=1.02, size=10)
        paths += _save(grid.figure, out, "idle_ecdf")

    phases = per_run_frame(runs, phase_frame)
    if len(phases):
        grid = sns.catplot(data=phases, x="worker", y="mean_ms", hue="phase", kind="bar",
                           order=_workers(phases), hue_order=list(BREAKDOWN), sharey=False,
                           **_facets(phases))
        grid.set_axis_labels("worker", "mean time per step (ms)")
        grid.set_titles("{col_name}", size=8)
        grid.figure.suptitle(f"Phase breakdown per worker — {scope}", y=1.02, size=10)
        paths += _save(grid.figure, out, "phase_breakdown")

    causes = per_run_frame(runs, cause_frame)
    if len(causes):
        grid = sns.catplot(data=causes, x="worker", y="part", hue="cause", kind="bar",
                           order=_workers(causes), sharey=False, **_facets(causes))
        grid.set_axis_labels("worker", "share of steps last x share of excess")
        grid.set_titles("{col_name}", size=8)
        grid.figure.suptitle(f"Straggler share and causes per worker — {scope}", y=1.02,
                             size=10)
        paths += _save(grid.figure, out, "straggler_causes")

    whatif = per_run_frame(runs, whatif_frame)
    if len(whatif):
        grid = sns.catplot(data=whatif, x="scenario", y="total_s", kind="bar", sharey=False,
                           **_facets(whatif))
        grid.set_axis_labels("scenario", "total time of measured steps (s)")
        grid.set_titles("{col_name}", size=8)
        grid.tick_params(axis="x", rotation=20)
        grid.figure.suptitle(f"What-if: without variability, balanced, all fastest — {scope}",
                             y=1.02, size=10)
        paths += _save(grid.figure, out, "what_if")

    slices = per_run_frame(runs, slices_frame)
    if len(slices) and slices.groupby(["run", "worker"])["batch_size"].nunique().max() > 1:
        grid = sns.relplot(data=slices, x="step", y="batch_size", hue="worker", kind="line",
                           drawstyle="steps-post", facet_kws={"sharey": False},
                           **_facets(slices))
        grid.set_axis_labels("step", "slice size (samples)")
        grid.set_titles("{col_name}", size=8)
        grid.figure.suptitle(f"Slice sizes over steps per worker — {scope}", y=1.02, size=10)
        paths += _save(grid.figure, out, "slices_per_step")

    table = runs_table(runs)
    if len(table) and table["compute_cv_max"].notna().any():
        import matplotlib.pyplot as plt

        figure, ax = plt.subplots(figsize=(7, 3.2))
        table["group"] = table["framework"] + " " + table["workload"] + "\n" + table["devices"]
        sns.boxplot(data=table, x="group", y="compute_cv_max", ax=ax, color="0.85")
        sns.stripplot(data=table, x="group", y="compute_cv_max", ax=ax, color="k", size=4)
        ax.set_xlabel("framework, workload, devices (each point: one repeat)")
        ax.set_ylabel("largest worker CV of compute time")
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"Compute-time CV over repeats — {scope}", size=10)
        paths += _save(figure, out, "cv_by_group")

    from analysis.convergence import curves

    curve = curves(evals)
    if len(curve):
        paths += _convergence_figure(curve, out, scope)
    from analysis.schemes import compares_schemes, scheme_table, staleness_counts

    if compares_schemes(runs):
        paths += _tradeoff_figure(scheme_table(runs, evals), out, scope)
        counts = staleness_counts(runs)
        if len(counts) and counts["staleness"].max() > 0:
            paths += _staleness_figure(counts, out, scope)
    paths += pipeline_figure(micro, out, scope)
    return paths


def pipeline_figure(runs: Pipelines, out: Path, scope: str) -> list[Path]:
    """HetPipe's picture: one wave of virtual worker 0 of each pipelined run (the first
    repeat of each run name; the wave of median span after warm-up), a row per stage, a
    box per micro-batch's forward (light) and backward (dark) labelled with its number;
    the gaps are the bubble."""
    import matplotlib.pyplot as plt

    from analysis.pipeline import is_pipelined, timeline, typical_wave

    chosen: dict[str, tuple[dict[str, Any], pd.DataFrame, int]] = {}
    for manifest, steps, micro in runs:
        name = manifest.get("run", {}).get("name", "?")
        if name in chosen or not is_pipelined(manifest) or micro.empty:
            continue
        wave = typical_wave(manifest, steps)
        if wave is not None:
            chosen[name] = (manifest, timeline(manifest, micro, wave), wave)
        if len(chosen) == MAX_TIMELINES:
            break
    if not chosen:
        return []
    figure, axes = plt.subplots(len(chosen), 1, figsize=(8, 1.4 + 0.9 * len(chosen)),
                                squeeze=False)
    colours = {False: "#9ecae1", True: "#3182bd"}
    for ax, (manifest, frame, wave) in zip(axes[:, 0], chosen.values(), strict=True):
        plan = manifest["pipeline"]
        stages = len(plan["virtual_workers"][0])
        for row in frame.itertuples(index=False):
            ax.broken_barh([(row.start_ms, row.duration_ms)], (row.stage - 0.4, 0.8),
                           facecolors=colours[bool(row.backward)], edgecolors="k",
                           linewidth=0.3)
            ax.text(row.start_ms + row.duration_ms / 2, row.stage, str(row.micro_batch),
                    ha="center", va="center", size=6,
                    color="white" if row.backward else "black")
        ax.set_yticks(range(stages))
        ax.set_yticklabels([f"stage {s} (rank {r})" for s, r in
                            enumerate(plan["virtual_workers"][0])], size=7)
        ax.invert_yaxis()
        ax.set_title(f"{_label(manifest)}: {plan['schedule']}, {plan['micro_batches']} "
                     f"micro-batches, wave {wave}, split {plan['bounds'][0]}", size=8)
    axes[-1, 0].set_xlabel("time from the wave's first micro-batch (ms); light: forward, "
                           "dark: backward")
    figure.suptitle(f"Pipeline timeline of virtual worker 0 — {scope}", size=10)
    figure.tight_layout()
    return _save(figure, out, "pipeline_timeline")


def _tradeoff_figure(table: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Time to target against the scheme's staleness bound, one point per scheme (mean and
    95% interval over the repeats that reached the target), beside samples/s: what a
    scheme buys in hardware efficiency and what it pays in statistical efficiency."""
    import math

    import matplotlib.pyplot as plt
    import numpy as np
    from scipy import stats

    finite = [b for b in table["bound"] if math.isfinite(b)]
    infinite_at = (max(finite) if finite else 0.0) + 2.0  # ps-async, drawn at the right
    names = list(dict.fromkeys(table["run"]))
    import seaborn as sns

    # one colour per scheme in both panels (past 10 the default palette repeats)
    colours = dict(zip(names, sns.color_palette("tab20" if len(names) > 10 else None,
                                                n_colors=len(names)), strict=True))
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for column, ax, label in (("time_to_target_s", axes[0],
                               "time to target (s of training)"),
                              ("samples_per_s", axes[1], "samples/s into updates")):
        for name, part in table.groupby("run", sort=False):
            values = part[column].dropna().to_numpy(dtype=float)
            if not len(values):
                continue
            bound = float(part["bound"].iloc[0])
            x = bound if math.isfinite(bound) else infinite_at
            half = (stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1)
                    / np.sqrt(len(values))) if len(values) > 1 else 0.0
            ax.errorbar(x, values.mean(), yerr=half, fmt="o", capsize=3,
                        color=colours.get(name))
            ax.annotate(str(name), (x, values.mean()), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
        ticks = sorted(set(finite)) + [infinite_at]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks[:-1]] + ["inf"])
        ax.set_xlabel("staleness bound (ssp: s; local SGD: H - 1; ps-async: inf)")
        ax.set_ylabel(label)
    figure.suptitle(f"Statistical against hardware efficiency per scheme — {scope}", size=10)
    figure.tight_layout()
    return _save(figure, out, "tradeoff")


def _staleness_figure(counts: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Share of updates per staleness value, one line per scheme that has stale updates
    (all repeats pooled)."""
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(6, 3.4))
    for name, part in counts.groupby("run", sort=False):
        if part["staleness"].max() == 0:
            continue
        pooled = part.groupby("staleness")["updates"].sum()
        ax.plot(pooled.index, pooled / pooled.sum(), marker="o", markersize=3, label=name)
    ax.set_xlabel("staleness (server versions)")
    ax.set_ylabel("share of updates")
    ax.legend(fontsize=7)
    ax.set_title(f"Staleness of the updates — {scope}", size=10)
    return _save(figure, out, "staleness")


def _convergence_figure(curve: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Held-out metric and loss against training time and against steps, one line per
    run (repeats as their mean with a band)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    measures = list(dict.fromkeys(curve["measure"]))
    names = list(dict.fromkeys(curve["run"]))
    # past 10 runs the default palette repeats its colours
    colours = sns.color_palette("tab20" if len(names) > 10 else None, n_colors=len(names))
    palette = dict(zip(names, colours, strict=True))
    figure, axes = plt.subplots(len(measures), 2, figsize=(9, 2.8 * len(measures)),
                                squeeze=False)
    for row, measure in enumerate(measures):
        part = curve[curve["measure"] == measure]
        for col, x in enumerate(("train_s", "step")):
            ax = axes[row][col]
            # against time every repeat is its own line (their evaluation times differ);
            # against steps, repeats share x: their mean with a 95% band
            per_repeat = {"units": "repeat", "estimator": None} if x == "train_s" else {}
            sns.lineplot(data=part, x=x, y="value", hue="run", palette=palette, ax=ax,
                         marker="o", markersize=3, linewidth=1,
                         legend=row == 0 and col == 1, **per_repeat)
            ax.set_xlabel("training time (s, evaluations excluded)" if x == "train_s"
                          else "step")
            ax.set_ylabel(f"held-out {measure.replace('_', ' ')}")
    if axes[0][1].get_legend() is not None:
        sns.move_legend(axes[0][1], "upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
    figure.suptitle(f"Held-out metric against time and steps — {scope}", size=10)
    figure.tight_layout()
    return _save(figure, out, "convergence")


SCALE_PANELS = (("idle_fraction", "idle fraction (of busy time)"),
                ("samples_per_s", "throughput (samples/s)"),
                ("mean_staleness", "mean staleness (updates)"))


def scale_figure(summary: pd.DataFrame, out: Path, title: str, name: str = "scale"
                 ) -> list[Path]:
    """hetbench simulate: idle fraction, throughput and mean staleness against the number
    of workers, a line per scheme (`summary`: simulate's table, a row per repeat)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    figure, axes = plt.subplots(1, len(SCALE_PANELS), figsize=(4.2 * len(SCALE_PANELS), 3.4),
                                layout="constrained")
    for ax, (column, label) in zip(axes, SCALE_PANELS, strict=True):
        sns.lineplot(data=summary, x="workers", y=column, hue="scheme", marker="o",
                     errorbar=("pi", 100), ax=ax, legend=ax is axes[-1])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers (simulated)")
        ax.set_ylabel(label)
    if axes[-1].get_legend() is not None:
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    figure.suptitle(title)
    return _save(figure, out, name)
