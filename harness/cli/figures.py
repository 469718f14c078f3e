"""`hetbench figures RESULTS... --out DIR`: the paper figures as PNG and PDF."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, or suite/results folders holding them")
    parser.add_argument("--out", type=Path, required=True, help="folder for the figures")


def run(args: argparse.Namespace) -> int:
    from analysis.figures import write_all
    from harness.results import find_runs, load_run, writable_folder

    loaded = [load_run(d) for d in find_runs(args.paths)]
    writable_folder(args.out, "--out")
    for path in write_all([(r.manifest, r.steps) for r in loaded], args.out,
                          [(r.manifest, r.evals) for r in loaded]):
        print(path)
    return 0
