"""`hetbench report RUN_DIR...`: the analysis in the terminal and in report.md with figures."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, or suite/results folders holding them")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for report.md and figures (default: report/ beside "
                             "the first path)")
    parser.add_argument("--no-figures", action="store_true", help="tables only")
    parser.add_argument("--target-loss", type=float, default=0.5,
                        help="loss for the time-to-target column of repartitioning runs "
                             "(default 0.5)")


def run(args: argparse.Namespace) -> int:
    from analysis import report
    from harness.results import find_runs, load_run, writable_folder

    run_dirs = find_runs(args.paths)
    loaded = [load_run(d) for d in run_dirs]
    runs = [(r.manifest, r.steps) for r in loaded]
    first = args.paths[0]
    out = args.out or (first.parent if (first / "manifest.json").is_file() else first) / "report"
    writable_folder(out, "--out")
    figures: list[str] = []
    if not args.no_figures:
        from analysis.figures import write_all

        figures = [p.name for p in write_all(runs, out, [(r.manifest, r.evals) for r in loaded])
                   if p.suffix == ".png"]
    markdown, terminal = report.build(runs, figures, args.target_loss,
                                      [(r.manifest, r.evals) for r in loaded])
    (out / "report.md").write_text(markdown)
    print(terminal)
    print(f"\nreport: {out / 'report.md'}" + (f" ({len(figures)} figures)" if figures else ""))
    return 0
