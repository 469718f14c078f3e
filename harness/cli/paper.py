"""`hetbench paper RESULTS... --out DIR`: every figure of a study and its table (Markdown and
LaTeX), regenerated in one command from the recorded runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from hetbench.harness.cli import arguments, launches
from hetbench.harness.cli.progress import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    launches.add_arguments(parser)
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, or suite/results folders holding them")
    parser.add_argument("--out", type=arguments.folder, required=True,
                        help="folder for the figures and table.md / table.tex")


def run(args: argparse.Namespace) -> int:
    from hetbench.analysis.render import paper
    from hetbench.analysis.render.figures import write_all
    from hetbench.harness.records.results import finished_runs_by_suite, writable_folder

    suites = finished_runs_by_suite(args.paths, f"each in {args.out}/SUITE",
                                    launches.choice(args))
    writable_folder(args.out, "--out")
    progress = Progress("paper")
    for name, runs in suites.items():
        out = args.out if len(suites) == 1 else writable_folder(args.out / name, "--out")
        progress(f"suite {name}: {len(runs)} runs read")
        for path in write_all(runs, out, progress.figures):
            print(path)
        progress("the study's table")
        table = paper.study_table(runs)
        if table.empty:
            continue
        text = paper.caption(runs, table)
        (out / "table.md").write_text(paper.markdown(table, text))
        (out / "table.tex").write_text(paper.latex_table(table, text))
        print(out / "table.md")
        print(out / "table.tex")
    return 0
