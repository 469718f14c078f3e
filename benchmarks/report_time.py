"""How long `hetbench report` takes on recorded runs, this tree against another revision's
(issue 59: a report of the `quick` suite's runs at least 2x faster), side by side.

    python benchmarks/report_time.py RESULTS/quick --base REV [--repeats 5] [--no-figures]

Each repeat runs both trees' `hetbench report` on the same runs (REV's from a temporary
`git worktree`, its own code on PYTHONPATH, as `hetbench ci` runs a base), in alternating
order, each into a fresh folder, and times the whole command from outside. Prints each
pair and the median of base / current: a ratio measured side by side on a shared machine,
not an absolute time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 900


def timed_report(tree: Path, runs: Path, out: Path, no_figures: bool) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), MPLBACKEND="Agg")
    argv = [sys.executable, "-m", "hetbench.harness.cli.main", "report", str(runs),
            "--out", str(out), *(["--no-figures"] if no_figures else [])]
    began = time.perf_counter()
    subprocess.run(argv, cwd=tree, env=env, check=True, capture_output=True,
                   timeout=TIMEOUT_S)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="a suite's results folder (or run directories')")
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-figures", action="store_true", help="tables only")
    args = parser.parse_args()
    worktree = Path(tempfile.mkdtemp(prefix="report-time-base-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force",
                    str(worktree), args.base], check=True, capture_output=True)
    ratios = []
    try:
        with tempfile.TemporaryDirectory(prefix="report-time-") as scratch:
            for repeat in range(args.repeats):
                sides = [("base", worktree), ("current", REPO)]
                if repeat % 2:
                    sides.reverse()
                took = {side: timed_report(tree, args.runs.resolve(),
                                           Path(scratch) / f"{side}-{repeat}", args.no_figures)
                        for side, tree in sides}
                ratios.append(took["base"] / took["current"])
                print(f"repeat {repeat}: base {took['base']:.2f} s, current "
                      f"{took['current']:.2f} s, base / current {ratios[-1]:.2f}", flush=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
                       capture_output=True)
    print(f"median base / current over {args.repeats} repeats: {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
