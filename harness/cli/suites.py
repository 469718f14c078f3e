"""`hetbench suites [NAME]`: the built-in suites, a line each; with a name, its TOML to copy."""

from __future__ import annotations

import argparse

from hetbench.harness.spec.builtin import builtin_suites, builtin_summary, builtin_text
from hetbench.harness.spec.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="print this built-in suite as TOML (to copy "
                        "and edit: hetbench suites quick > my.toml)")


def run(args: argparse.Namespace) -> int:

    names = builtin_suites()
    if args.name is not None:
        if args.name not in names:
            raise UsageError("suites", f"no built-in suite {args.name!r} (built-in: "
                             f"{', '.join(names)})")
        print(builtin_text(args.name), end="")
        return 0
    width = max(len(n) for n in names)
    for name in names:
        print(f"{name:<{width}}  {builtin_summary(name)}")
    print("\nhetbench run NAME runs one; hetbench suites NAME prints it as TOML.")
    return 0
