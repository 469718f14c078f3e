"""`hetbench launch CONFIG -- [python] SCRIPT [ARGS...]`: a user's own training script (one
that calls `hetbench.join`) run as each run of CONFIG says, as torchrun would start it: one
process per worker under this Python, each told its rank, its device, threads, cores and
emulated slowdown, the run's global batch and slices, in the run's own network namespace,
watched, stopped and closed as any run of `hetbench run` (a suite whose runs set `script`
and `args` is the same), on one host or across hosts (the same command on each, as
`run`). CONFIG is a suite without workloads: its runs' workers, partitions, global
batches, seeds and repeats; the script brings its model, data and loop
(harness/spec/loops.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hetbench.harness.cli import arguments
from hetbench.harness.cli import run as run_command
from hetbench.harness.spec.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options(parser)
    parser.add_argument("config", help="suite TOML: the runs' workers, partitions, global "
                        "batches and repeats (no workload: the script brings its model)")
    parser.add_argument("script_command", nargs=argparse.REMAINDER,
                        metavar="-- [python] SCRIPT [ARGS]",
                        help="the script and its arguments, after `--`")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, help="override the suite's repeats")
    arguments.add_run_filter(parser, "only the runs")
    parser.add_argument("--out", type=arguments.folder, default=Path("results"),
                        help="results folder (default: results/)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-figures", action="store_true",
                        help="draw no figures at the end (`hetbench figures` draws them later)")
    run_command.add_host_arguments(parser)  # given before CONFIG, or between it and `--`


def split_options(args: argparse.Namespace) -> list[str]:
    """The command after `--`; launch's own options given between CONFIG and `--` (which
    the remainder took) read into `args`."""
    words = list(args.script_command)
    if "--" not in words:
        return words
    cut = words.index("--")
    if cut:
        options = argparse.ArgumentParser(prog="hetbench launch CONFIG")
        _options(options)
        options.parse_args(words[:cut], namespace=args)
    return words[cut + 1:]


def script_and_args(command: list[str]) -> tuple[str, tuple[str, ...]]:
    """The script and its arguments from the command: a leading `python`, `python3`
    or this interpreter is dropped (the script runs under hetbench's Python, as torchrun
    runs it), the script's path made absolute."""
    words = command
    if words and (Path(words[0]).name in ("python", "python3")
                  or os.path.realpath(words[0]) == os.path.realpath(sys.executable)):
        words = words[1:]
    if not words:
        raise UsageError("command", "missing: hetbench launch CONFIG -- [python] SCRIPT "
                         "[ARGS...]")
    if words[0].startswith("-"):
        raise UsageError("command", f"{words[0]!r}: give the script's path (a module run "
                         "with -m is not supported yet)")
    script = Path(words[0]).resolve()
    if not script.is_file():
        raise UsageError("command", f"{words[0]}: no such file (the script every worker runs)")
    return str(script), tuple(words[1:])


def run(args: argparse.Namespace) -> int:
    script, script_args = script_and_args(split_options(args))
    as_run = argparse.Namespace(**vars(args), suite=args.config, steps=None,
                                skip_unavailable=False, script=script,
                                script_args=script_args)
    return run_command.run_and_collect(as_run, [])
