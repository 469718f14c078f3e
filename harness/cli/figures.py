"""`hetbench figures RESULTS... --out DIR`: the paper figures as PNG and PDF."""

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
                        help="folder for the figures")


def run(args: argparse.Namespace) -> int:
    from hetbench.analysis.render.figures import write_all
    from hetbench.harness.records.results import finished_runs_by_suite, writable_folder

    suites = finished_runs_by_suite(args.paths, f"figures of each in {args.out}/SUITE",
                                    launches.choice(args))
    writable_folder(args.out, "--out")
    progress = Progress("figures")
    for name, runs in suites.items():
        out = args.out if len(suites) == 1 else writable_folder(args.out / name, "--out")
        progress(f"suite {name}: {len(runs)} runs read")
        for path in write_all(runs, out, progress):
            print(path)
    return 0
