"""Figures (the only module that plots), as PNG and PDF. Each figure's title says which
runs it shows and whether heterogeneity was real or emulated; axes carry units.

Inputs are recorded runs (hetbench.harness.records.results.Run, as load_run gives them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.models.deviceclass import short_name
from hetbench.analysis.render import drawing
from hetbench.analysis.tables.convergence import curves
from hetbench.analysis.tables.repartition import slices_over_steps
from hetbench.analysis.tables.runs import run_row, run_tables, runs_table
from hetbench.analysis.tables.schemes import compares_schemes, scheme_table, staleness_counts
from hetbench.analysis.view.metrics import (
    PHASE_COLUMNS,
    after_warmup,
    complete_steps,
    instrumented,
    phase_stats,
    with_derived,
)
from hetbench.harness.records.results import Run

Runs = Sequence[Run]
MAX_TIMELINES = 6  # panels of the pipeline timeline figure (and of the step timeline)
DPI = 300  # PNGs print sharp in a paper's column
# One colour per phase in every figure (stacked bars, step timeline): idle red,
# communication blue, compute phases greens, the rest muted.
PHASE_COLOURS = {
    "load": "#8c564b", "to_device": "#e7ba52", "forward": "#74c476", "backward": "#238b45",
    "bubble": "#bdbdbd", "pack": "#bcbddc", "idle": "#d62728", "comm": "#1f77b4",
    "push": "#6baed6", "wait": "#fd8d3c", "pull": "#08519c", "unpack": "#9e9ac8",
    "apply": "#54278f",
}  # in the order a step runs them (legends follow it)


def _label(manifest: dict[str, Any]) -> str:
    """A panel's title: the run's name and repeat (the run id's timestamp tells a reader
    nothing), and whether its heterogeneity was real or emulated."""
    name = manifest.get("run", {}).get("name") or manifest.get("run_id", "?")
    return f"{name} r{manifest.get('repeat', 0)} ({manifest.get('heterogeneity', '?')})"


def _scope(runs: Runs) -> str:
    kinds = sorted({run.manifest.get("heterogeneity", "?") for run in runs})
    suites = sorted({run.manifest.get("suite", {}).get("name", "?") for run in runs})
    return f"{len(runs)} run(s) of {', '.join(suites)}; heterogeneity: {', '.join(kinds)}"


def _drawn(run: Run) -> bool:
    """The run has instrumented steps after its warm-up: the per-run figures draw it."""
    return bool(len(run.steps)) and instrumented(after_warmup(run.steps, run.warmup_steps))


def per_run_frame(runs: Runs, build: Callable[[Run], pd.DataFrame]) -> pd.DataFrame:
    parts = []
    for run in runs:
        if _drawn(run):
            frame = build(run)
            if len(frame):
                parts.append(frame.assign(run=_label(run.manifest)))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def worker_names(manifest: dict[str, Any], ranks: pd.Series) -> pd.Series:
    """Legend entries: the rank and what the worker is ('1 cpu-3x', '0 cuda'), not 'worker 1'."""
    workers = manifest.get("run", {}).get("workers") or []
    names = {r: f"{r} {short_name(w)}" for r, w in enumerate(workers) if isinstance(w, dict)}
    return ranks.map(lambda r: names.get(int(r), str(r))).astype(str)


def compute_frame(run: Run) -> pd.DataFrame:
    manifest, steps = run.manifest, run.steps
    d = with_derived(complete_steps(after_warmup(steps, run.warmup_steps)))
    return pd.DataFrame({"worker": worker_names(manifest, d["rank"]), "step": d["step"],
                         "compute_ms": d["compute_ns"] / 1e6, "idle_ms": d["idle_ns"] / 1e6})


# The all-reduce phase is shown as its two parts: idle (waiting for the last worker) and
# communication (after the last worker arrived); in the order a step runs them.
BREAKDOWN = ("load", "to_device", "forward", "backward", "bubble", "pack", "idle", "comm",
             "unpack", "apply")
assert set(BREAKDOWN) == set(PHASE_COLUMNS) - {"allreduce"} | {"idle", "comm", "bubble"}


def phase_frame(run: Run) -> pd.DataFrame:
    manifest, steps = run.manifest, run.steps
    stats = phase_stats(steps, run.warmup_steps)
    stats = stats[stats["phase"].isin(BREAKDOWN)]
    phase = stats["phase"].astype(str)
    if (manifest.get("run") or {}).get("pipeline"):  # a stage's pack slot holds its bubble
        phase = phase.replace("pack", "bubble")
    return stats.assign(worker=worker_names(manifest, stats["rank"]), phase=phase)


def cause_frame(run: Run) -> pd.DataFrame:
    manifest, tables = run.manifest, run_tables(run)  # as the report's section of the run
    shares = tables["causes"]
    shares = shares[shares["rank"] >= 0]
    last = tables["stragglers"].set_index("rank")["share_last"]
    shares = shares.assign(worker=worker_names(manifest, shares["rank"]),
                           share_last=shares["rank"].map(last))
    # Each cause's part of all steps: share of steps last x share of its excess.
    shares["part"] = shares["share"].fillna(0) * shares["share_last"]
    return shares


def slices_frame(run: Run) -> pd.DataFrame:
    manifest, steps = run.manifest, run.steps
    frame = slices_over_steps(steps)
    return frame.assign(worker=worker_names(manifest, frame["rank"]))


def whatif_frame(run: Run) -> pd.DataFrame:
    if run.spec.get("pipeline"):  # no data-parallel batch to re-slice
        return pd.DataFrame()
    return run_tables(run)["what_if"]


def _save(figure: Any, out: Path, name: str) -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.layout_engine import PlaceHolderLayoutEngine
    from matplotlib.text import Text

    # TrueType (42), not Type 3, fonts in the PDF: what journals' submission checks ask for
    plt.rcParams["pdf.fonttype"] = 42
    plt.rcParams["ps.fonttype"] = 42

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    try:
        # savefig draws a figure once more for each file before drawing it, to run its
        # layout engine and find its tight box: here the box is found once for both, at
        # the dpi they are saved at, padded as savefig pads it; a figure drawn only where a
        # layout engine places its parts when drawn (constrained layout's colour bar: a box
        # found before it cropped the colour bar), the others being laid out already
        # (tight_layout at their end). The engine is then set aside, as savefig sets it
        # aside while it draws.
        figure.set_dpi(DPI)
        if not isinstance(figure.get_layout_engine(), (PlaceHolderLayoutEngine, type(None))):
            figure.draw_without_rendering()
        box = figure.get_tightbbox(figure.canvas.get_renderer()).padded(
            plt.rcParams["savefig.pad_inches"])
        figure.set_layout_engine(None)
        # no ligatures: the glyph of "fi" (a run named "profiled") lies past the font's
        # first 256 characters, and each PDF embedded a second subset of the font for it
        # (0.1-0.3 s a PDF; text of several lines is drawn without these features: the CV
        # figure's labels)
        for text in figure.findobj(Text):
            text.set_fontfeatures(["-liga"])
        for path in paths:
            try:
                figure.savefig(path, bbox_inches=box, dpi=DPI)
            except Exception as exc:  # noqa: BLE001 - a full disk, whatever the writer says
                # Pillow's OSError names no file; matplotlib's PDF writer answers a full disk
                # with an AttributeError raised while handling the OSError: say which file
                cause: BaseException | None = exc
                while cause is not None and not isinstance(cause, OSError):
                    cause = cause.__context__
                if cause is None:
                    raise
                raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from exc
    finally:
        plt.close(figure)
    return paths


def _workers(frame: pd.DataFrame) -> list[str]:
    return sorted(frame["worker"].unique(), key=lambda name: int(name.split()[0]))


# a panel's drawing: (its axes, its run's rows, each hue value's colour)
PanelDrawing = Callable[[Any, pd.DataFrame, dict[str, Any]], None]


def _per_run_panels(frame: pd.DataFrame, draw: PanelDrawing, hue: str,
                    axis_labels: tuple[str, str], sharey: bool = True) -> Any:
    """A panel per run (frame["run"], at most three a row; x shared, y where `sharey`),
    each drawn by `draw(ax, the run's rows, colours)`, where colours gives each `hue` value
    one colour in every panel (the default cycle, in order of appearance; tab20 where the
    values are more than its colours), and one legend
    of them right of the panels: the layout of seaborn's relplot, laid out once (its grid
    laid itself out again after each label, a third of these figures' time)."""
    names = list(dict.fromkeys(frame["run"]))
    figure, axes = _panels(len(names), 3.92, 2.8, sharex=True, sharey=sharey)
    values = list(dict.fromkeys(frame[hue]))
    cycle = _colour_cycle()
    if len(values) > len(cycle):  # more than the cycle tells apart (the 13 causes)
        import matplotlib
        from matplotlib.colors import to_hex

        tab20 = matplotlib.colormaps["tab20"]
        # its ten hues first, then their light shades: neighbours stay told apart
        cycle = [to_hex(tab20(i)) for i in (*range(0, 20, 2), *range(1, 20, 2))]
    colours = {value: cycle[i % len(cycle)] for i, value in enumerate(values)}
    for index, (ax, name) in enumerate(zip(axes, names, strict=True)):
        draw(ax, frame[frame["run"] == name], colours)
        ax.set_title(name, size=8)
        ax.spines[["top", "right"]].set_visible(False)
        if index + 3 >= len(names):  # no panel below: this column's x axis is labelled here
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel(axis_labels[0])
        if index % 3 == 0:
            ax.set_ylabel(axis_labels[1])
    entries = _handles_by_label(axes)
    labels = [str(value) for value in colours if str(value) in entries]
    figure.legend([entries[x] for x in labels], labels, title=hue, loc="center left",
                  bbox_to_anchor=(1.0, 0.5), frameon=False)
    figure.tight_layout()
    return figure


def _colour_cycle() -> list[str]:
    """The default colour cycle (seaborn's palette where no theme is set)."""
    import matplotlib.pyplot as plt

    return list(plt.rcParams["axes.prop_cycle"].by_key()["color"])


def write_all(runs: Runs, out: Path, progress: drawing.Progress | None = None,
              processes: int | None = None) -> list[Path]:
    """Every figure that the runs have data for (their steps, held-out evaluations and
    micro-batches); returns the files written. The groups of figures are drawn side by
    side, at most `processes` at once (analysis/render/drawing.py); `progress`, where
    given, is told each group as it is done ("3 of 12 done: phases")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401 - imported once here, not in each drawing process
    import seaborn  # noqa: F401

    scope = _scope(runs)
    groups: list[drawing.Group] = [
        ("compute and idle per step",
         lambda: _compute_figures(per_run_frame(runs, compute_frame), out, scope)),
        ("phases", lambda: _phase_bars(per_run_frame(runs, phase_frame), out, scope)),
        ("straggler causes",
         lambda: _causes_figure(per_run_frame(runs, cause_frame), out, scope)),
        ("what-if", lambda: _whatif_bars(per_run_frame(runs, whatif_frame), out, scope)),
        ("slices", lambda: _slices_figure(per_run_frame(runs, slices_frame), out, scope)),
        ("compute CV over repeats", lambda: _cv_figure(runs_table(runs), out, scope)),
        ("convergence", lambda: _convergence_figure(curves(runs), out, scope)),
        ("schemes", lambda: _scheme_figures(runs, out, scope)),
        ("pipeline", lambda: pipeline_figure(runs, out, scope)),
        ("step timeline", lambda: step_timeline_figure(runs, out, scope)),
        ("slices of a step", lambda: batch_table_figure(runs, out, scope)),
        ("heatmap", lambda: heatmap_figure(runs, out, scope)),
    ]
    _work_out_shared_tables(runs)
    return drawing.draw(groups, progress, processes, LONGEST_FIRST)


# The groups that take longest, longest first: drawn one by one on the `quick` suite's runs,
# 2.2, 1.8, 1.3, 1.3, 1.1, 1.0, 0.9 and 0.6 s (2026-11-29, medians of 3), the others 0.05 s
# or nothing
LONGEST_FIRST = ("compute and idle per step", "heatmap", "straggler causes", "step timeline",
                 "phases", "what-if", "slices of a step", "compute CV over repeats")


def _work_out_shared_tables(runs: Runs) -> None:
    """What several groups of figures and the report read, worked out before the groups
    are drawn (in other processes, which would each work it out again, and keep it from
    the report): each run's runs-table row and, where the figures draw them, its tables."""
    for run in runs:
        run_row(run)
        if _drawn(run):
            run_tables(run)


def _causes_figure(causes: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Each worker's share of the steps it was last, split over the causes: a bar per cause
    beside each other, every worker of the runs on each panel's axis."""
    if not len(causes):
        return []
    workers = _workers(causes)
    kinds = list(dict.fromkeys(causes["cause"]))
    width = 0.8 / len(kinds)

    def bars(ax: Any, part: pd.DataFrame, colours: dict[str, Any]) -> None:
        for k, cause in enumerate(kinds):
            rows = part[part["cause"] == cause]
            if len(rows):
                at = [workers.index(w) + (k - (len(kinds) - 1) / 2) * width
                      for w in rows["worker"]]
                ax.bar(at, rows["part"], width=width, color=colours[cause], label=cause)
        ax.set_xticks(range(len(workers)), workers)

    figure = _per_run_panels(causes, bars, "cause",
                                ("worker", "share of steps last x share of excess"))
    figure.suptitle(f"Straggler share and causes per worker ({scope})", y=1.02, size=10)
    return _save(figure, out, "straggler_causes")


def _slices_figure(slices: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Each worker's slice over the steps, where a slice moved."""
    if not (len(slices) and
            slices.groupby(["run", "worker"])["batch_size"].nunique().max() > 1):
        return []
    figure = _per_run_panels(slices, _lines("step", "batch_size", drawstyle="steps-post"),
                                "worker", ("step", "slice size (samples)"), sharey=False)
    figure.suptitle(f"Slice sizes over steps per worker ({scope})", y=1.02, size=10)
    return _save(figure, out, "slices_per_step")


def _lines(x: str, y: str, **style: Any) -> PanelDrawing:
    """A panel's drawing: a line of y over x per worker, in x's order."""
    def draw(ax: Any, part: pd.DataFrame, colours: dict[str, Any]) -> None:
        for worker, rows in part.groupby("worker", sort=False):
            rows = rows.sort_values(x, kind="stable")
            ax.plot(rows[x], rows[y], color=colours[worker], label=worker, **style)
    return draw


def _ecdfs(ax: Any, part: pd.DataFrame, colours: dict[str, Any]) -> None:
    """A panel's drawing: each worker's ECDF of its idle time (its share of steps idle at
    most x), a step at each value."""
    for worker, rows in part.groupby("worker", sort=False):
        values = np.sort(rows["idle_ms"].dropna().to_numpy(dtype=float))
        line, = ax.plot(values, np.arange(1, len(values) + 1) / len(values),
                        drawstyle="steps-post", color=colours[worker], label=worker)
        line.sticky_edges.y[:] = [0, 1]


def _scheme_figures(runs: Runs, out: Path, scope: str) -> list[Path]:
    """The schemes' trade-off, and their staleness, where the runs compare schemes."""
    if not compares_schemes(runs):
        return []
    paths = _tradeoff_figure(scheme_table(runs), out, scope)
    counts = staleness_counts(runs)
    if len(counts) and counts["staleness"].max() > 0:
        paths += _staleness_figure(counts, out, scope)
    return paths


def _compute_figures(compute: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Each worker's compute time per step, and the ECDF of its idle time."""
    if not len(compute):
        return []
    paths: list[Path] = []
    # panels share their axes: runs are read against each other
    figure = _per_run_panels(compute, _lines("step", "compute_ms", linewidth=0.8),
                                "worker", ("step", "compute time per batch (ms)"))
    figure.suptitle(f"Per-batch compute time per worker ({scope})", y=1.02, size=10)
    paths += _save(figure, out, "compute_per_step")

    figure = _per_run_panels(compute, _ecdfs, "worker",
                                ("idle before all-reduce (ms)", "share of steps"))
    figure.suptitle(f"ECDF of idle time before all-reduce ({scope})", y=1.02, size=10)
    paths += _save(figure, out, "idle_ecdf")
    return paths


def _cv_figure(table: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """The largest worker CV of compute time, each configuration's repeats as points."""
    if not (len(table) and table["compute_cv_max"].notna().any()):
        return []
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(7, 3.2))
    # a group is one configuration (a run of a suite) and its points are its repeats:
    # runs that differ in anything (the partition too) are never pooled
    several = table["suite"].nunique() > 1
    group = ((table["suite"] + ": " if several else "") + table["run"] + "\n"
             + table["devices"])
    names = list(dict.fromkeys(group))
    values = [table.loc[group == name, "compute_cv_max"].dropna().to_numpy(dtype=float)
              for name in names]
    drawn = [i for i, v in enumerate(values) if len(v)]
    grey = {"color": "0.5"}
    ax.boxplot([values[i] for i in drawn], positions=drawn, widths=0.8, patch_artist=True,
               boxprops={"facecolor": "0.85", "edgecolor": "0.5"}, medianprops=grey,
               whiskerprops=grey, capprops=grey, flierprops={"markeredgecolor": "0.5"})
    # each repeat a point, spread sideways at random (seeded: the same figure each time)
    jitter = np.random.default_rng(0)
    for i in drawn:
        ax.scatter(i + jitter.uniform(-0.08, 0.08, len(values[i])), values[i], color="k",
                   s=16, zorder=3, linewidths=0)
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_xlabel("run, devices (each point: one repeat)")
    ax.set_ylabel("largest worker CV of compute time")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(f"Compute-time CV over repeats ({scope})", size=10)
    return _save(figure, out, "cv_by_group")


def _panels(count: int, width: float, height: float, **kwargs: Any) -> tuple[Any, list[Any]]:
    """A grid of `count` panels, at most three a row (the unused ones hidden)."""
    import matplotlib.pyplot as plt

    cols = min(3, count)
    rows = -(-count // cols)
    figure, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows),
                                squeeze=False, **kwargs)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return figure, flat[:count]


def _legend_right(figure: Any, axes: list[Any]) -> None:
    """One legend for every panel, right of them: each label once, phases in the order a
    step runs them (PHASE_COLOURS' order)."""
    entries = _handles_by_label(axes)
    order = list(PHASE_COLOURS)
    labels = sorted(entries, key=lambda x: order.index(x) if x in order else len(order))
    figure.legend([entries[x] for x in labels], labels, loc="upper left",
                  bbox_to_anchor=(1.0, 0.95), fontsize=7, frameon=False)


def _handles_by_label(axes: list[Any]) -> dict[str, Any]:
    """Each label drawn on the panels, once, with the first handle drawn for it."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    return entries


def phase_stack(phases: pd.DataFrame) -> pd.DataFrame:
    """One run's phase_frame as the stacked bars draw it: a row per worker (rank order), a
    column per phase that took any time (the order a step runs them), mean ms per step.
    A row's sum is the worker's mean step, begin to end."""
    table = phases.pivot_table(index="worker", columns="phase", values="mean_ms",
                               aggfunc="sum")
    table = table.reindex(sorted(table.index, key=lambda w: int(w.split()[0]))).fillna(0.0)
    return table[[p for p in BREAKDOWN if p in table and table[p].sum() > 0]]


def _phase_bars(phases: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """A stacked bar per worker: its mean time per step in each phase, in the order the
    step runs them, idle before the all-reduce and communication apart. The bar's height
    is the worker's mean step; panels share the time axis."""
    if not len(phases):
        return []
    runs = list(dict.fromkeys(phases["run"]))
    figure, axes = _panels(len(runs), 3.6, 3.0, sharey=True)
    for ax, name in zip(axes, runs, strict=True):
        stack = phase_stack(phases[phases["run"] == name])
        bottom = pd.Series(0.0, index=stack.index)
        for phase in stack.columns:
            ax.bar(stack.index, stack[phase], bottom=bottom, color=PHASE_COLOURS[phase],
                   label=phase, width=0.6)
            bottom += stack[phase]
        ax.set_title(name, size=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel("worker")
    axes[0].set_ylabel("mean time per step (ms)")
    _legend_right(figure, axes)
    figure.suptitle(f"Phase breakdown per worker ({scope})", size=10)
    figure.tight_layout()
    return _save(figure, out, "phase_breakdown")


def _whatif_bars(whatif: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Each scenario's total time as a share of the measured total (panels share that
    axis), each bar labelled with its seconds."""
    if not len(whatif):
        return []
    runs = list(dict.fromkeys(whatif["run"]))
    figure, axes = _panels(len(runs), 3.6, 3.0, sharey=True)
    for ax, name in zip(axes, runs, strict=True):
        part = whatif[whatif["run"] == name]
        actual = float(part.loc[part["scenario"] == "actual", "total_s"].iloc[0])
        bars = ax.bar(part["scenario"], part["total_s"] / actual, color="0.6", width=0.6)
        ax.bar_label(bars, [f"{t:.3g} s" for t in part["total_s"]], fontsize=6, padding=1)
        ax.set_title(name, size=8)
        ax.tick_params(axis="x", labelsize=7, rotation=20)
    axes[0].set_ylabel("total time / measured")
    figure.suptitle(f"What-if: without variability, balanced, all fastest ({scope})",
                    size=10)
    figure.tight_layout()
    return _save(figure, out, "what_if")


def _first_of_each_run(runs: Runs) -> list[Run]:
    """The first repeat of each run name (at most MAX_TIMELINES): the close-up figures
    show one example of each configuration."""
    chosen: dict[str, Run] = {}
    for run in runs:
        name = run.manifest.get("run", {}).get("name", "?")
        if name not in chosen and len(chosen) < MAX_TIMELINES:
            chosen[name] = run
    return list(chosen.values())


def step_timeline_figure(runs: Runs, out: Path, scope: str) -> list[Path]:
    """A few consecutive steps after warm-up of each run: a row per worker, its phases as
    coloured spans on one time axis, so the idle before each all-reduce (red) shows who
    waited for whom."""
    from hetbench.analysis.measures.timeline import STEPS_SHOWN, step_spans

    shown = [(run.manifest, spans) for run in _first_of_each_run(runs)
             if len(spans := step_spans(run.steps, run.warmup_steps))]
    if not shown:
        return []
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(shown), 1, figsize=(9, 1.2 + 0.35 * sum(
        spans["rank"].nunique() + 1 for _, spans in shown)), squeeze=False)
    flat = list(axes[:, 0])
    for ax, (manifest, spans) in zip(flat, shown, strict=True):
        ranks = sorted(spans["rank"].unique())
        for phase, part in spans.groupby("phase", sort=False):
            for rank, rows in part.groupby("rank"):
                ax.broken_barh(list(zip(rows["start_ms"], rows["duration_ms"], strict=True)),
                               (ranks.index(rank) - 0.4, 0.8),
                               facecolors=PHASE_COLOURS.get(str(phase), "0.5"),
                               label=str(phase))
        names = worker_names(manifest, pd.Series(ranks))
        ax.set_yticks(range(len(ranks)), list(names), size=7)
        ax.invert_yaxis()
        first, last = spans["step"].min(), spans["step"].max()
        ax.set_title(f"{_label(manifest)}: steps {first}-{last}", size=8)
    flat[-1].set_xlabel(f"time from the first step's begin (ms); {STEPS_SHOWN} steps after "
                        "warm-up")
    _legend_right(figure, flat)
    figure.suptitle(f"Step timeline per worker ({scope})", size=10)
    figure.tight_layout()
    return _save(figure, out, "step_timeline")


def batch_table_figure(runs: Runs, out: Path, scope: str) -> list[Path]:
    """Choi's table as a figure: each worker's compute time per batch for consecutive
    batches after warm-up, a cell per (worker, batch), the straggler of each batch (the
    worker ready last) outlined."""
    from matplotlib.patches import Rectangle

    from hetbench.analysis.measures.timeline import batch_times

    shown = []
    for run in _first_of_each_run(runs):
        table, straggler = batch_times(run.steps, run.warmup_steps)
        if len(table):
            shown.append((run.manifest, table, straggler))
    if not shown:
        return []
    figure, axes = _panels(len(shown), 4.2, 0.9 + 0.45 * max(len(t) for _, t, _ in shown))
    for ax, (manifest, table, straggler) in zip(axes, shown, strict=True):
        _labelled_cells(ax, table)
        for col, step in enumerate(table.columns):
            row = list(table.index).index(straggler[step])
            ax.add_patch(Rectangle((col, row), 1, 1, fill=False, edgecolor="#d62728", lw=1.5))
        ax.set_yticks([i + 0.5 for i in range(len(table))],
                      list(worker_names(manifest, pd.Series(table.index))), size=7, rotation=0)
        ax.set_xlabel("batch (step)", size=8)
        ax.set_ylabel("")
        ax.set_title(_label(manifest), size=8)
    figure.suptitle(f"Compute time per batch (ms), the straggler of each outlined ({scope})",
                    size=10)
    figure.tight_layout()
    return _save(figure, out, "batch_times")


def _labelled_cells(ax: Any, table: pd.DataFrame) -> None:
    """The table as grey cells (darker: longer), each labelled with its value, the first
    row at the top: seaborn's annotated heatmap, drawn without the trial draws of the whole
    figure it makes to see whether tick labels overlap."""
    values = table.to_numpy(dtype=float)
    mesh = ax.pcolormesh(values, cmap="Greys", edgecolors="white", linewidth=0.5,
                         vmin=np.nanmin(values), vmax=np.nanmax(values))
    for (row, col), value in np.ndenumerate(values):
        if np.isfinite(value):
            # dark text on light cells, white on dark (the W3C's relative luminance)
            rgb = np.asarray(mesh.to_rgba(value))[:3]
            linear = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
            light = linear @ [0.2126, 0.7152, 0.0722] > 0.408
            ax.text(col + 0.5, row + 0.5, f"{value:.1f}", ha="center", va="center", size=7,
                    color="0.15" if light else "white")
    ax.set_xlim(0, values.shape[1])
    ax.set_ylim(values.shape[0], 0)
    ax.set_xticks(np.arange(values.shape[1]) + 0.5, [str(c) for c in table.columns])
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)


def heatmap_figure(runs: Runs, out: Path, scope: str) -> list[Path]:
    """SMon's heatmap of each run (its first repeat): workers as rows, steps as columns,
    each cell the step's compute over the worker's median (analysis/measures/heatmap.py); slice
    changes marked above, evaluations below."""
    from matplotlib.colors import LogNorm

    from hetbench.analysis.measures.heatmap import heatmap

    shown = [(run.manifest, h) for run in _first_of_each_run(runs)
             if (h := heatmap(run.steps, run.warmup_steps, run.evals)) is not None]
    if not shown:
        return []
    import matplotlib.pyplot as plt

    rows = sum(len(h.ratios) for _, h in shown)
    figure, axes = plt.subplots(len(shown), 1, squeeze=False, layout="constrained", figsize=(
        9, 1.0 + 0.9 * len(shown) + min(0.18 * rows, 12)))
    # ratios around 1 (white), on a log scale so that 2x slower and 2x faster look alike
    norm = LogNorm(vmin=0.25, vmax=4)
    images = []
    for ax, (manifest, map_) in zip(axes[:, 0], shown, strict=True):
        steps = list(map_.ratios.columns)
        width = map_.bin_steps
        extent = (steps[0] - 0.5, steps[-1] + width - 0.5, len(map_.ratios) - 0.5, -0.5)
        images.append(ax.imshow(map_.ratios.to_numpy(dtype=float).clip(0.25, 4),
                                aspect="auto", cmap="RdBu_r", norm=norm, extent=extent,
                                interpolation="nearest"))
        ax.set_yticks(range(len(map_.ratios)),
                      list(worker_names(manifest, pd.Series(map_.ratios.index))),
                      size=6 if len(map_.ratios) <= 16 else 4)
        for step in map_.repartitions:
            ax.plot(step, -0.5, marker="v", color="k", markersize=4, clip_on=False)
        for step in map_.evaluations:
            ax.plot(step, len(map_.ratios) - 0.5, marker="^", color="#2ca02c",
                    markersize=4, clip_on=False)
        binned = f"; a cell: the largest of {width} steps" if width > 1 else ""
        ax.set_title(f"{_label(manifest)}{binned}", size=8)
    axes[-1, 0].set_xlabel("step (▼ slices changed, ▲ evaluated; blank: left out)")
    bar = figure.colorbar(images[0], ax=list(axes[:, 0]), label="compute / worker's median",
                          shrink=0.8)
    bar.set_ticks([0.25, 0.5, 1, 2, 4], labels=["≤0.25", "0.5", "1", "2", "≥4"])
    bar.minorticks_off()
    figure.suptitle(f"Compute per worker and step over the worker's median ({scope})",
                    size=10)
    return _save(figure, out, "heatmap")


def pipeline_figure(runs: Runs, out: Path, scope: str) -> list[Path]:
    """HetPipe's picture: one wave of virtual worker 0 of each pipelined run (the first
    repeat of each run name; the wave of median span after warm-up), a row per stage, a
    box per micro-batch's forward (light) and backward (dark) labelled with its number;
    the gaps are the bubble."""
    import matplotlib.pyplot as plt

    from hetbench.analysis.measures.pipeline import is_pipelined, timeline, typical_wave

    chosen: dict[str, tuple[dict[str, Any], pd.DataFrame, int]] = {}
    for run in runs:
        manifest, micro = run.manifest, run.micro
        name = manifest.get("run", {}).get("name", "?")
        if name in chosen or not is_pipelined(manifest) or micro.empty:
            continue
        wave = typical_wave(run)
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
    figure.suptitle(f"Pipeline timeline of virtual worker 0 ({scope})", size=10)
    figure.tight_layout()
    return _save(figure, out, "pipeline_timeline")


def _tradeoff_figure(table: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Time to target against the scheme's staleness bound, one point per scheme (mean and
    95% interval over the repeats that reached the target), beside samples/s: what a
    scheme buys in hardware efficiency and what it pays in statistical efficiency."""
    import math

    import matplotlib.pyplot as plt
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
    figure.suptitle(f"Statistical against hardware efficiency per scheme ({scope})", size=10)
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
    ax.set_title(f"Staleness of the updates ({scope})", size=10)
    return _save(figure, out, "staleness")


def _convergence_figure(curve: pd.DataFrame, out: Path, scope: str) -> list[Path]:
    """Held-out metric and loss against training time and against steps, one line per
    run (repeats as their mean with a band)."""
    if not len(curve):
        return []
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
            # seed: the band's bootstrap draws the same figure from the same runs
            sns.lineplot(data=part, x=x, y="value", hue="run", palette=palette, ax=ax,
                         marker="o", markersize=3, linewidth=1, seed=0,
                         legend=row == 0 and col == 1, **per_repeat)
            ax.set_xlabel("training time (s, evaluations excluded)" if x == "train_s"
                          else "step")
            ax.set_ylabel(f"held-out {measure.replace('_', ' ')}")
    if axes[0][1].get_legend() is not None:
        sns.move_legend(axes[0][1], "upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
    figure.suptitle(f"Held-out metric against time and steps ({scope})", size=10)
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


def history_figure(history: pd.DataFrame, out: Path) -> list[Path]:
    """The committed baselines over commits (html_report.history_table): median samples/s
    and step time of each snapshot, oldest left."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if history.empty:
        return []
    labels = [f"{d}\n{c[:7]}" for d, c in zip(history["date"], history["commit"], strict=True)]
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.0))
    for ax, (column, label) in zip(axes, (("samples_per_s", "samples/s (median of runs)"),
                                          ("mean_step_ms", "mean step (ms, median of runs)")),
                                   strict=True):
        ax.plot(range(len(history)), history[column], marker="o")
        ax.set_xticks(range(len(history)), labels, size=7)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    figure.suptitle("Committed baselines (suite ci) over commits", size=10)
    figure.tight_layout()
    return _save(figure, out, "regression_history")


def advice_figure(ranked: pd.DataFrame, out: Path, title: str, name: str = "advice"
                  ) -> list[Path]:
    """hetbench advise: each remedy's predicted time of the recorded work (the range over
    simulated repeats), best at the top; a cross where --verify measured it. Remedies that
    change the gradient are hatched (their time to target is not predicted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ranked.iloc[::-1]
    y = np.arange(len(rows))
    figure, ax = plt.subplots(figsize=(7.5, 0.9 + 0.28 * len(rows)), layout="constrained")
    colours = ["tab:grey" if k == "recorded" else "tab:blue" for k in rows["kind"]]
    bars = ax.barh(y, rows["seconds"], color=colours, alpha=0.75,
                   xerr=[rows["seconds"] - rows["seconds_low"],
                         rows["seconds_high"] - rows["seconds"]], capsize=2)
    for bar, exact in zip(bars, rows["exact"], strict=True):
        if not exact:
            bar.set_hatch("//")
    if "measured_s" in rows and rows["measured_s"].notna().any():
        ax.plot(rows["measured_s"], y, "x", color="black", markersize=7, label="measured")
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_yticks(y, rows["label"], size=7)
    ax.set_xlabel("predicted time of the recorded work (s)")
    ax.set_xlim(left=0)
    ax.set_title(title, size=9, loc="left")
    return _save(figure, out, name)


def explain_figure(result: pd.DataFrame, out: Path, title: str, name: str = "explain"
                   ) -> list[Path]:
    """hetbench explain: per intervention, the share of the straggler excess the
    attribution gave the cause it removes (predicted, hatched) beside the reduction of
    lost time measured by removing it (the mean of the repeats, its 95% interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.iloc[::-1]
    y = np.arange(len(rows))
    figure, ax = plt.subplots(figsize=(7.5, 1.2 + 0.45 * len(rows)), layout="constrained")
    height = 0.38
    ax.barh(y + height / 2, rows["predicted"], height, color="tab:grey", alpha=0.6,
            hatch="//", label="predicted (the cause's share of the excess)")
    low = (rows["measured"] - rows["measured_low"]).fillna(0).clip(lower=0)
    high = (rows["measured_high"] - rows["measured"]).fillna(0).clip(lower=0)
    ax.barh(y - height / 2, rows["measured"], height, color="tab:blue", alpha=0.8,
            xerr=[low, high], capsize=3, label="measured reduction of the straggler excess")
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_yticks(y, [f"{c}: {i}" for c, i in zip(rows["cause"], rows["intervention"],
                                                   strict=True)], size=8)
    ax.set_xlabel("share of the recorded straggler excess")
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=7)
    ax.set_title(title, size=9, loc="left")
    return _save(figure, out, name)
