"""`hetbench report RUN_DIR...`: the analysis in the terminal and in report.md with figures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hetbench.harness.cli import arguments, launches
from hetbench.harness.cli.progress import Progress
from hetbench.harness.records import baselines
from hetbench.harness.spec.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    launches.add_arguments(parser)
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, or suite/results folders holding them")
    parser.add_argument("--out", type=arguments.folder, default=None,
                        help="folder for report.md and figures (default: report/ beside "
                             "the first path)")
    parser.add_argument("--no-figures", action="store_true", help="tables only")
    parser.add_argument("--html", action="store_true",
                        help="also report.html: one self-contained page (figures embedded, "
                             "configuration, environment, regression history of the "
                             "committed baselines)")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="the summary printed: text that fits 100 columns (default), "
                             "or JSON with the same headline and tables for scripts")
    parser.add_argument("--target-loss", type=float, default=0.5,
                        help="loss for the time-to-target column of repartitioning runs "
                             "(default 0.5)")


def run(args: argparse.Namespace) -> int:
    from hetbench.harness.records.results import finished_runs_by_suite, writable_folder

    suites = finished_runs_by_suite(args.paths, "reported apart",
                                    launches.choice(args))
    first = args.paths[0]
    out = args.out or (first.parent if (first / "manifest.json").is_file() else first) / "report"
    writable_folder(out, "--out")
    write_missing_traces([r for runs in suites.values() for r in runs])
    printed = {}
    for name, runs in suites.items():
        if len(suites) > 1 and args.format == "text":
            print(f"\n== suite {name} ==\n")
        printed[name] = report_suite(
            runs, out if len(suites) == 1 else writable_folder(out / name, "--out"), args)
    if args.format == "json":
        print(json.dumps(printed, indent=1))
    return 0


def write_missing_traces(runs: list[Any]) -> None:
    """The trace of a run closed without one (its closing was cut short after the manifest:
    a SIGKILL, a full disk), written now; a run folder that cannot be written is left."""
    from hetbench.harness.records.results import note
    from hetbench.harness.records.rundir import write_missing_trace

    for run in runs:
        try:
            if write_missing_trace(run.run_dir, run.manifest, run.steps):
                note(f"{run.run_dir}: its trace was missing; written now")
        except OSError as exc:
            note(f"{run.run_dir}: its trace is missing and cannot be written "
                 f"({exc.strerror or exc})")


def report_suite(runs: list[Any], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """report.md (and the figures) of one suite's runs in `out`; the summary printed as
    text, or returned for JSON."""
    from hetbench.analysis.render import report, terminal

    progress = Progress("report")
    progress(f"{len(runs)} runs read")
    figures: list[str] = []
    if not args.no_figures:
        from hetbench.analysis.render.figures import write_all

        figures = [p.name for p in write_all(runs, out, progress.figures)
                   if p.suffix == ".png"]
    progress("tables")
    markdown, summary = report.build(runs, figures, args.target_loss)
    (out / "report.md").write_text(markdown)
    files = {"report": str(out / "report.md"), "figures": [str(out / f) for f in figures]}
    if args.html:
        progress("report.html, with the committed baselines' history")
        write_html(runs, markdown, out)
        files["html"] = str(out / "report.html")
    if args.format == "json":
        return {**terminal.as_data(summary), **files}
    print(terminal.render(summary))
    print(f"\nreport: {out / 'report.md'}" + (f" ({len(figures)} figures)" if figures else ""))
    if args.html:
        print(f"html: {files['html']}")
    return files


def write_html(runs: list[Any], markdown: str, out: Path) -> None:
    """report.html beside report.md: the page, with the committed baselines' history."""
    from hetbench.analysis.render.figures import history_figure
    from hetbench.analysis.render.html_report import history_table, page
    from hetbench.harness.records.results import find_runs, load_finished_runs, note

    with baselines.snapshots() as found:
        points = []
        for snapshot in found:
            try:
                loaded = load_finished_runs(find_runs([snapshot.folder]))
            except UsageError as exc:  # a snapshot this version cannot read: left out, said
                note(f"regression history: commit {snapshot.commit[:10]} left out: {exc}")
                continue
            points.append((snapshot.commit, snapshot.date, snapshot.subject, loaded))
    history = history_table(points)
    drawn = history_figure(history, out)
    suites = sorted({run.manifest.get("suite", {}).get("name", "?") for run in runs})
    text = page(f"hetbench report: {', '.join(suites)}", markdown, out, runs, history,
                drawn[0] if drawn else None)
    (out / "report.html").write_text(text)
