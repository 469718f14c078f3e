"""The options that choose launches (one `hetbench run` each) where a command reads runs."""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--launch", metavar="GLOB", help="read the runs of the launches "
                        "whose id matches (default: the newest launch of each suite)")
    parser.add_argument("--pool-launches", action="store_true",
                        help="read every launch, pooled as repeats")


def choice(args: argparse.Namespace) -> Any:
    from hetbench.harness.records.results import LaunchChoice

    return LaunchChoice(args.launch, args.pool_launches)
