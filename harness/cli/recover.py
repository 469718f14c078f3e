"""`hetbench recover PATH...`: close runs left `running` by a launcher that died.

A SIGKILL (or a power cut) ends `hetbench run` before it can close its run: the manifest
still says `running` and the records are in their parts. This closes each such run as
`failed`, writing steps.parquet from the flushed parts; runs whose launcher still lives
are left alone. Across hosts, another node's share of a run (harness/run/nodes.py) left
`running` is closed `failed` the same way, its flushed parts kept where they are (node 0
holds the run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetbench.harness.records import manifest
from hetbench.harness.run import nodes
from hetbench.harness.spec.errors import NotClosed, UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, or suite/results folders holding them")


def run(args: argparse.Namespace) -> int:
    from hetbench.harness.records.rundir import recover

    runs, shares = _found(args.paths)
    running = [d for d in runs if manifest.read(d).get("status") == "running"]
    shares = [s for s in shares if nodes.share_state(s).get("status") == "running"]
    if not running and not shares:
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
    for share in shares:
        try:
            rows = nodes.recover_share(share)
        except UsageError as exc:
            refused += 1
            print(f"hetbench: {exc}", file=sys.stderr)
            continue
        print(f"{share}: this node's share, closed as failed ({rows} step records kept in "
              "its parts)")
    return 1 if refused else 0


def _found(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """The run directories and the shares of other nodes at the paths or below them; a
    path with neither is an error."""
    from hetbench.harness.records.results import find_runs

    runs: list[Path] = []
    shares: list[Path] = []
    for path in paths:
        held = nodes.find_shares(path) if path.is_dir() else []
        try:
            runs += find_runs([path])
        except UsageError:
            if not held:
                raise
        shares += held
    return list(dict.fromkeys(runs)), list(dict.fromkeys(shares))
