"""`hetbench devices`: per framework, installed or not (and the extra that installs it), its
version, the devices it sees, the native aggregation strategies it offers and hetbench's
aggregators for it (harness/run/probe.py asks each in a process of its own)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from hetbench.harness.run.probe import DEFAULT_TIMEOUT_S, FrameworkInfo, probe_all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds each framework probe may take "
                             f"(default: {DEFAULT_TIMEOUT_S:g})")


def _print_table(infos: list[FrameworkInfo]) -> None:
    for info in infos:
        if info.status == "ok":
            print(f"{info.framework} {info.version}")
            print(f"  devices:    {', '.join(info.devices) or 'none'}")
            print(f"  native:     {', '.join(info.strategies) or 'none'}")
            print(f"  hetbench:   aggregator = {' | '.join(info.hetbench_aggregators)}")
        elif info.status == "not installed":
            print(f"{info.framework}: not installed ({info.install})")
        else:
            print(f"{info.framework}: broken: {info.reason}")
    print("native: what each framework offers; hetbench: what a suite's `aggregator` may "
          "name (all but the framework's own work with any mix of frameworks).")


def run(args: argparse.Namespace) -> int:
    infos = probe_all(args.timeout)
    if args.json:
        print(json.dumps([asdict(i) for i in infos], indent=2))
    else:
        _print_table(infos)
    # a framework that is installed but cannot start is worth a non-zero status
    return 1 if any(i.status == "broken" for i in infos) else 0
