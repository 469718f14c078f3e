"""`hetbench ci --base REF [SUITE]`: the regression gate.

Runs SUITE for the base commit and for the working tree on this machine, one launch of each
per round, then `hetbench compare`s them (same exit statuses: 0, 1 regression, 3
inconclusive, 2 error). The base runs its own code: a temporary `git worktree` of REF, with
a Python started there (cwd and PYTHONPATH) that calls the tree's own launcher
(hetbench.harness.run.launcher.run_suite; before the rooms were installed under `hetbench`,
harness.run.launcher.run_suite), so its workers import the base's harness, adapters and
workloads: the worktree's hetbench/ links to its own rooms. Both sides run the same suite
definition (the working tree's text, one repeat per launch), so only the code differs.

A suite of jobs named by import path (a user's own model) gates the user's commits instead:
the repository is the one holding the jobs' project folder, the base side runs its code at
REF (a worktree of that repository, each job's `project` moved into it) and both sides run
the one installed hetbench. The built-in suites, and `.ci/run`, gate hetbench's commits.

Rounds alternate the order, A B B A A B ...: a shared machine drifts (other jobs, thermal
state, page cache), and interleaving spreads the drift over both sides instead of letting
it land on one; alternating who goes first also cancels any effect of running second.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hetbench.harness.cli import arguments
from hetbench.harness.cli.compare import add_statistics_arguments, report, settings_from
from hetbench.harness.run.jobcheck import check_jobs
from hetbench.harness.run.nodes import CLOSE_MARGIN_S
from hetbench.harness.spec.builtin import builtin_text
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import SuiteSpec, load_suite
from hetbench.harness.spec.tables import run_table
from hetbench.harness.spec.tables import suite_text as written_suite
from hetbench.harness.system import children

DEFAULT_SUITE = "ci"
SIDES = ("base", "current")
# What the gate judges unless --metrics says otherwise: the speed of the whole step and of
# each worker's compute. The variability metrics (compute CV, idle fraction) and the
# all-reduce phase vary 27-54% between launches of the same code here, so at a 10%
# threshold they are inconclusive in most A/A comparisons; `hetbench compare` shows them.
GATE_METRICS = "step_time_ms,samples_per_s,compute_ms"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hetbench.harness.cli.compare import EPILOG

    parser.epilog = ("Runs the suite for REF (in a temporary git worktree, with REF's own code)\n"
                     "and for the working tree, one launch each per round, in the order\n"
                     "A B B A A B ..., then compares them:\n\n" + EPILOG)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("suite", nargs="?", default=DEFAULT_SUITE,
                        help=f"suite TOML file or built-in name (default: {DEFAULT_SUITE})")
    parser.add_argument("--base", required=True, metavar="REF",
                        help="git commit (or branch, tag, HEAD~1) to compare against")
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds, i.e. launches per side (default: the suite's repeats)")
    parser.add_argument("--out", type=arguments.folder, default=None,
                        help="where both sides' results go (default: results/ci/<UTC time>)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="committed runs of the suite to compare the working tree's "
                             "against too (default: results/baselines/SUITE of the checkout, "
                             "where it exists); reported, never failing the gate")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the comparison with the committed baseline")
    add_statistics_arguments(parser, metrics=GATE_METRICS)


def run(args: argparse.Namespace) -> int:
    from hetbench.analysis.tables.compare import compare_paths
    from hetbench.harness.records.results import writable_folder

    settings = settings_from(args)
    suite = load_suite(args.suite)
    rounds = suite.repeats if args.repeats is None else args.repeats
    if rounds < 1:
        raise UsageError("--repeats", f"{rounds} is not allowed (at least 1)")
    users = user_repository(suite)  # a suite of the user's own jobs gates the user's code
    repo = users or source_repository()
    commit = resolve_commit(repo, args.base)
    if users is not None:
        check_jobs(suite)  # the working tree's jobs, before anything runs
    out = (args.out or Path("results") / "ci" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))
    out = writable_folder(out.resolve(), "--out")
    say(f"hetbench ci: suite {suite.name}, {rounds} round(s); base {args.base} = "
        f"{commit[:12]}, current = working tree {repo}; results in {out}")
    worktree = Path(tempfile.mkdtemp(prefix="hetbench-base-"))
    git(repo, "worktree", "add", "--detach", "--force", str(worktree), commit)
    failed_launches = 0
    # on a signal, a launch gets as long as its slowest run may take to close
    close_wait_s = max(children.CLOSE_WAIT_S,
                       max(r.timeout_s for r in suite.runs) + CLOSE_MARGIN_S + 60)
    try:
        trees = {"base": worktree, "current": repo}
        if users is None:
            # Both sides run the working tree's suite text: a built-in suite may not exist
            # at REF.
            (out / "suite.toml").write_text(suite_text(args.suite))
            files = {side: out / "suite.toml" for side in SIDES}
        else:
            files = {side: out / f"suite-{side}.toml" for side in SIDES}
            for side in SIDES:
                files[side].write_text(moved_suite(suite, repo, trees[side]))
        for i in range(rounds):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            for side in order:
                code = run_side(side, trees[side], files[side], out, i, rounds,
                                own_code=users is None, close_wait_s=close_wait_s)
                failed_launches += side == "current" and code != 0
    finally:
        git(repo, "worktree", "remove", "--force", str(worktree), check=False)
        shutil.rmtree(worktree, ignore_errors=True)
    comparison = compare_paths(out / "base", out / "current", settings)
    report(comparison, out / "base", out / "current", args.json)
    if not args.no_baseline:
        against_baseline(args.baseline or repo / "results" / "baselines" / suite.name,
                         out / "current", settings, args.json)
    if failed_launches:
        # compare leaves failed runs out, so they could pass as `inconclusive`: a tree whose
        # training runs fail has regressed, whatever the timings of the rest say.
        say(f"hetbench ci: {failed_launches} launch(es) of the working tree had runs that did "
            f"not complete (logs in {out / 'logs'}): counted as a regression")
        return 1
    return int(comparison.exit_status)


def against_baseline(baseline: Path, current: Path, settings: Any, as_json: bool) -> None:
    """The working tree's runs against the committed baseline: a drift that HEAD~1 cannot
    show (a series of small slowdowns). Reported only: the baseline was recorded in another
    session, and sessions of one machine class differ by more than a threshold
    (docs/howto/ci-gate.md). With --json, its verdict goes to stderr."""
    from hetbench.analysis.tables.compare import compare_paths

    if not baseline.is_dir():
        say(f"hetbench ci: no committed baseline at {baseline}: not compared")
        return
    comparison = compare_paths(baseline, current, settings)
    ratios = ", ".join(f"{r.metric} x{r.ratio:.3g}" for r in comparison.table.itertuples()
                       if r.worker < 0)
    say(f"hetbench ci: against the committed baseline {baseline}: "
        f"{comparison.verdict} ({ratios or 'no run-wide metric'}; reported, not gating)")
    if not as_json:
        print(f"\n-- against the committed baseline ({baseline}; reported, not gating) --")
        report(comparison, baseline, current, False)


def say(text: str) -> None:
    """Progress goes to stderr: stdout is the verdict (a table, or JSON with --json)."""
    print(text, file=sys.stderr, flush=True)


def user_repository(suite: SuiteSpec) -> Path | None:
    """The git repository holding the suite's jobs (a workload named by import path), or
    None for a suite of built-in workloads (hetbench's own gate)."""
    projects = {run.project for run in suite.runs if run.project is not None}
    if not projects:
        return None
    tops = {git(Path(p), "rev-parse", "--show-toplevel", check=False) for p in projects}
    if "" in tops:
        raise UsageError("workload", "hetbench ci gates the commits of the repository that "
                         "holds the jobs' project folder, and "
                         f"{sorted(projects)[0]} is in no git repository")
    if len(tops) > 1:
        raise UsageError("workload", "the suite's jobs live in several repositories "
                         f"({', '.join(sorted(tops))}): gate one at a time")
    return Path(tops.pop())


def moved_suite(suite: SuiteSpec, repo: Path, tree: Path) -> str:
    """The suite as TOML with each job's project folder moved from `repo` into `tree`
    (the base's worktree, or the working tree itself), one repeat per launch."""
    runs = []
    for run in suite.runs:
        if run.project is not None:
            inside = Path(run.project).resolve().relative_to(repo.resolve())
            run = dataclasses.replace(run, project=str(tree / inside))
        runs.append(run_table(run))
    return written_suite(suite.name, suite.description, 1, runs)


def source_repository() -> Path:
    """The git checkout this hetbench runs from: the CURRENT side."""
    source = Path(__file__).resolve().parents[2]
    top = git(source, "rev-parse", "--show-toplevel", check=False)
    if not top:
        raise UsageError(str(source), "hetbench ci needs hetbench to run from a git checkout")
    return Path(top)


def resolve_commit(repo: Path, ref: str) -> str:
    commit = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if not commit:
        raise UsageError("--base", f"{ref!r} is not a commit of {repo}")
    return commit


def git(repo: Path, *args: str, check: bool = True) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError("git", f"cannot run git: {exc}") from None
    if done.returncode != 0:
        if check:
            lines = done.stderr.strip().splitlines() or ["failed"]
            raise UsageError(f"git {args[0]}", lines[-1])
        return ""
    return done.stdout.strip()


def suite_text(name_or_path: str) -> str:
    path = Path(name_or_path)
    if path.is_file():
        return path.read_text()
    return builtin_text(name_or_path)


# Runs one round of the suite (repeats = 1) through the side's own launcher: what
# `hetbench run` does minus its summary and figures, which cost more than the runs
# themselves on a short suite.
RUNNER = """
import dataclasses
import signal
import sys
from pathlib import Path
from typing import Any
# what `hetbench run` does on a signal, in any tree's launcher: it closes its run on a
# KeyboardInterrupt, and SIGTERM (hetbench ci passes its own on) would end Python at once
def interrupted(number, frame):
    raise KeyboardInterrupt(f"interrupted by {signal.Signals(number).name}")
signal.signal(signal.SIGINT, signal.default_int_handler)
for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(number, interrupted)
# The tree's own hetbench (`own`: hetbench's gate), found by the tree's layout, not by what
# imports: an older tree has no hetbench/, and `import hetbench` there would find the
# installed (current) one. A user's gate (`installed`) runs the installed hetbench.
if sys.argv[3] == "installed" or Path("hetbench", "__init__.py").is_file():
    from hetbench.harness.spec.errors import UsageError
    from hetbench.harness.spec.suite import load_suite
    from hetbench.harness.run.launcher import run_suite
else:
    try:  # the rooms, imported bare
        from harness.spec.errors import UsageError
        from harness.spec.suite import load_suite
        from harness.run.launcher import run_suite
    except ModuleNotFoundError:  # before the harness was split into rooms
        from harness.config import load_suite
        from harness.errors import UsageError
        from harness.launch import run_suite
try:
    suite = dataclasses.replace(load_suite(sys.argv[1]), repeats=1)
    results = run_suite(suite, Path(sys.argv[2]))
except UsageError as exc:
    print(f"hetbench: error: {exc}", file=sys.stderr)
    sys.exit(2)
except KeyboardInterrupt as exc:  # the run is closed (interrupted)
    print(f"hetbench: {exc.args[0] if exc.args else 'interrupted (Ctrl-C)'}", file=sys.stderr)
    sys.exit(130)
for r in results:
    print(r.status, r.run_dir, r.reason)
sys.exit(1 if any(r.status != "completed" for r in results) else 0)
"""


def run_side(side: str, tree: Path, suite_file: Path, out: Path, i: int, rounds: int,
             own_code: bool = True, close_wait_s: float = children.CLOSE_WAIT_S) -> int:
    """One launch of the suite with the side's code (`own_code`: the tree's hetbench; else
    the installed hetbench on the tree's jobs); its output goes to a log. Returns the
    launch's exit status (0: every run completed)."""
    env = dict(os.environ)
    if own_code:
        env["PYTHONPATH"] = os.pathsep.join([str(tree),
                                             *filter(None, [env.get("PYTHONPATH")])])
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    log = logs / f"{side}-{i}.log"
    start = time.monotonic()
    command = [sys.executable, *([] if own_code else ["-P"]), "-c", RUNNER, str(suite_file),
               str(out / side), "own" if own_code else "installed"]
    with open(log, "w") as f:  # a signal goes on to the launch, which closes its run
        code = children.run_and_wait(command, f"the {side} side's launch",
                                     f"hetbench recover {out / side}", close_wait_s,
                                     cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
    say(f"round {i + 1}/{rounds} {side:<7} exit {code}  {time.monotonic() - start:5.1f} s  "
        f"[{log}]")
    if code == 2:  # the side could not run the suite at all: nothing to compare
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        raise UsageError(f"{side} ({tree})", lines[-1] if lines else f"exit 2, see {log}")
    return code
