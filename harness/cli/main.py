"""`hetbench` entry point. Imports no framework: subcommands are loaded on use."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable

from hetbench.harness import __version__
from hetbench.harness.spec.errors import NodeLost, NotClosed, UsageError
from hetbench.harness.system import signals
from hetbench.harness.system.exits import exit_after

CLI = "hetbench.harness.cli."
# subcommand -> module with add_arguments(parser) and run(args) -> exit status
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": (CLI + "run", "run a benchmark suite (default: the built-in 'quick')"),
    "launch": (CLI + "launch", "run your own training script (one that calls "
               "hetbench.join) as a suite's runs: hetbench launch CONFIG -- train.py ARGS"),
    "init": (CLI + "init", "a starter suite for your own model: hetbench init pkg.module:make"),
    "suites": (CLI + "suites", "the built-in suites, a line each; one as TOML to copy"),
    "compare": (CLI + "compare", "BASE vs CURRENT runs: regressed, improved, unchanged?"),
    "ci": (CLI + "ci", "regression gate: a suite for --base REF and this tree, compared"),
    "report": (CLI + "report", "analyse runs: tables in the terminal, report.md, figures"),
    "figures": (CLI + "figures", "write the paper figures (PNG and PDF) for runs"),
    "export": (CLI + "export", "runs as TensorBoard scalars or MLPerf-style logs"),
    "paper": (CLI + "paper", "every figure and the study's table (Markdown, LaTeX) "
              "of recorded runs, in one command"),
    "simulate": (CLI + "simulate", "fit recorded runs, simulate 8 to 4,096 workers "
                 "under each scheme"),
    "advise": (CLI + "advise", "rank the remedies for a recorded job by simulation; "
               "write them as a suite, --verify runs it"),
    "explain": (CLI + "explain", "take a recorded run's largest straggler causes away, "
                "one variant each, run them beside it: measured against predicted"),
    "import": (CLI + "import_traces", "a job's torch.profiler traces (one per rank) as a "
               "run directory: report, simulate and advise on a job hetbench never ran"),
    "recover": (CLI + "recover", "close runs left 'running' by a launcher that died"),
    "devices": (CLI + "devices", "frameworks here: installed?, version, devices, strategies"),
    "testbed": (CLI + "testbed", "hosts emulated as network namespaces (198.18.0.0/15), "
                "links shaped with tc: up until Ctrl-C, or down"),
}


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `commands`, only those subcommands get their arguments (the
    others keep their name and help), so a command imports its own module and no other's:
    every module's import costs ~0.4 s of each start on two cores."""
    parser = argparse.ArgumentParser(
        prog="hetbench",
        description="Variability study and benchmarking harness for heterogeneous "
                    "data-parallel training.",
    )
    parser.add_argument("--version", action="version", version=f"hetbench {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(module=module)
        if commands is None or name in commands:
            # Argument definitions live beside each command but must not import frameworks.
            importlib.import_module(module).add_arguments(sub_parser)
    return parser


def named_command(argv: list[str]) -> list[str]:
    """The subcommand ARGV names, as a list for build_parser: the first word that is not
    an option (hetbench's own options take no value)."""
    return [word for word in argv if not word.startswith("-")][:1]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(named_command(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    signals.install()  # SIGTERM, SIGHUP, SIGQUIT as Ctrl-C; Ctrl-C even if inherited ignored
    try:
        return int(importlib.import_module(args.module).run(args))
    except UsageError as exc:
        if args.debug:
            raise
        print(f"hetbench: error: {exc}", file=sys.stderr)
        return 2
    except (NotClosed, NodeLost) as exc:  # not bad input: a folder or a host went away
        print(f"hetbench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print(f"hetbench: {signals.describe(exc)}", file=sys.stderr)
        return signals.exit_status(exc)
    except OSError as exc:  # a path the input named that cannot be read or written
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"hetbench: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug: status 2, never 1 (a regression)
        if args.debug:
            raise
        print(f"hetbench: internal error: {type(exc).__name__}: {exc} (--debug shows the "
              "traceback)", file=sys.stderr)
        return 2


def entry() -> None:
    """The `hetbench` command: main(), then an exit that skips the interpreter's teardown
    (harness/system/exits.py says why)."""
    exit_after(main)


if __name__ == "__main__":
    entry()
