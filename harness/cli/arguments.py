"""Argument types the subcommands share (argparse `type=`): a bad value gets argparse's line
naming the option, exit status 2, before anything runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.system import paths


def folder(text: str) -> Path:
    """An output folder. An empty one would quietly write into the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: name a folder ('.' for the current one)")
    if (found := paths.foreign_link(Path(text))) is not None:
        raise argparse.ArgumentTypeError(paths.refusal(*found))
    return Path(text)


def add_run_filter(parser: argparse.ArgumentParser, which: str,
                   metavar: str = "PATTERN") -> None:
    """`-k PATTERN`, repeatable: `which` runs (a sentence's start: "only the runs") whose
    name matches any of the patterns given (args.runs: a list, or None)."""
    parser.add_argument("-k", dest="runs", metavar=metavar, type=run_pattern, action="append",
                        help=f"{which} whose name matches (a glob, else a substring); -k "
                        "again adds runs")


def run_pattern(text: str) -> str:
    """`-k`: a glob or a substring of run names. An empty one matches every run."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: it would match every run (leave -k out to "
                                         "take them all)")
    return text


def check_bounds(value: int | None, name: str, low: int, high: int) -> None:
    """An option's integer checked after parsing (its bounds may depend on the input read:
    a recorded run's warm-up), as one line naming it; None: not given."""
    if value is not None and not low <= value <= high:
        raise UsageError(name, f"{value} is outside {low}..{high}")
