"""`hetbench recover PATH...`: close runs left `running` by a launcher that died.

A SIGKILL (or a power cut) ends `hetbench run` before it can close its run: the manifest
still says `running` and the records are in their parts. This closes each such run as
`failed`, writing steps.parquet from the flushed parts; runs whose launcher still lives
are left alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.records import manifest
from harness.spec.errors import NotClosed, UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, or suite/results folders holding them")


def run(args: argparse.Namespace) -> int:
    from harness.records.results import find_runs
    from harness.records.rundir import recover

    running = [d for d in find_runs(args.paths) if manifest.read(d).get("status") == "running"]
    if not running:
        print("no run says running: nothing to recover")
        return 0
    refused = 0
    for run_dir in running:
        try:
            result = recover(run_dir)
        except (UsageError, NotClosed) as exc:  # the others are still closed
            refused += 1
            print(f"hetbench: {exc}", file=sys.stderr)
            continue
        rows = manifest.read(run_dir).get("rows")
        print(f"{run_dir}: closed as {result.status} ({rows} step records kept)")
    return 1 if refused else 0
