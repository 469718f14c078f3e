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
The two launches of a round are compared as a pair (analysis/tables/paired.py), on metrics
the host's other work does not move (each worker's CPU time per sample, its compute less
its wait for a CPU); step time and samples/s are reported as what the user feels.

How many rounds: `--repeats N` runs N. Without it the gate looks for a verdict after each
round from paired.MIN_ROUNDS on and stops at the first (regressed, or unchanged), or when
the spread it sees would need more rounds than `--max-rounds` (then inconclusive, saying
how many it would need).
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

from hetbench.analysis.tables.gate_history import DEFAULT_LAST
from hetbench.analysis.tables.paired import GATE_METRICS, MIN_ROUNDS
from hetbench.harness.cli import arguments, gate_report
from hetbench.harness.cli.compare import report
from hetbench.harness.cli.statistics import add_statistics_arguments, paired_settings
from hetbench.harness.cli.statistics import settings_from as unpaired_settings
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
DEFAULT_MAX_ROUNDS = 20
# the committed baseline (one launch of many repeats, unpaired): the wall clock's speed of
# the whole step and of each worker's compute
BASELINE_METRICS = "step_time_ms,samples_per_s,compute_ms"


EPILOG = """\
Runs the suite for REF (in a temporary git worktree, with REF's own code) and for the
working tree, one launch each per round, in the order A B B A A B ..., and compares each
round's two launches as a pair: one value per launch and metric (its median over steps),
one ratio per round, their geometric mean with Student's interval, at a level Bonferroni-
corrected over the gate metrics' rows. The gate metrics are ones the host's other work does
not move: each worker's CPU time per sample and its compute less its wait for a CPU.
Step time and samples/s are reported beside them, never gating. regressed = a gate
metric worse beyond the threshold with its interval clear of 1; unchanged = every gate
metric's interval inside the threshold band; else inconclusive, with the rounds the spread
would need. Without --repeats the gate
stops at the first verdict from round 5 on. Exit status: 0 unchanged (or improved), 1
regression (or a run of the working tree failed), 3 inconclusive, 2 usage or harness error.
The committed baseline (one launch of many repeats) is compared unpaired and never gates."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("suite", nargs="?", default=DEFAULT_SUITE,
                        help=f"suite TOML file or built-in name (default: {DEFAULT_SUITE})")
    parser.add_argument("--base", required=True, metavar="REF",
                        help="git commit (or branch, tag, HEAD~1) to compare against")
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds, i.e. launches per side (default: as many as a verdict "
                             f"needs, from {MIN_ROUNDS} up to --max-rounds)")
    parser.add_argument("--max-rounds", type=int, default=DEFAULT_MAX_ROUNDS,
                        help="without --repeats, the most rounds the gate runs "
                             f"(default {DEFAULT_MAX_ROUNDS})")
    parser.add_argument("--out", type=arguments.folder, default=None,
                        help="where both sides' results go (default: results/ci/<UTC time>)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="committed runs of the suite to compare the working tree's "
                             "against too (default: results/baselines/SUITE of the checkout, "
                             "where it exists); reported, never failing the gate")
    parser.add_argument("--history", type=arguments.folder, default=None, metavar="DIR",
                        help="keep this gate's measurements in DIR, per commit, and fail on a "
                             "drift over the last gates whose commits follow one another "
                             "(a slowdown that creeps in a few percent a commit)")
    parser.add_argument("--history-last", type=int, default=DEFAULT_LAST, metavar="N",
                        help=f"the most gates a drift reaches back over (default "
                             f"{DEFAULT_LAST})")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the comparison with the committed baseline")
    add_statistics_arguments(parser, gate=",".join(GATE_METRICS))


def run(args: argparse.Namespace) -> int:
    from hetbench.analysis.tables.paired import compare_paired, stop_after
    from hetbench.harness.records.results import writable_folder

    settings = paired_settings(args, ",".join(GATE_METRICS))
    suite = load_suite(args.suite)
    if args.repeats is not None and args.repeats < 1:
        raise UsageError("--repeats", f"{args.repeats} is not allowed (at least 1)")
    if args.max_rounds < MIN_ROUNDS:
        raise UsageError("--max-rounds", f"{args.max_rounds} is not allowed (at least "
                         f"{MIN_ROUNDS})")
    arguments.check_bounds(args.history_last, "--history-last", 2, 1000)
    rounds = args.max_rounds if args.repeats is None else args.repeats
    planned = "" if args.repeats is not None else \
        f" at most (it stops at the first verdict from round {MIN_ROUNDS} on)"
    users = user_repository(suite)  # a suite of the user's own jobs gates the user's code
    repo = users or source_repository()
    commit = resolve_commit(repo, args.base)
    if users is not None:
        check_jobs(suite)  # the working tree's jobs, before anything runs
    out = (args.out or Path("results") / "ci" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))
    out = writable_folder(out.resolve(), "--out")
    say(f"hetbench ci: suite {suite.name}, {rounds} round(s){planned}; base {args.base} = "
        f"{commit[:12]}, current = working tree {repo}; results in {out}")
    worktree = Path(tempfile.mkdtemp(prefix="hetbench-base-"))
    git(repo, "worktree", "add", "--detach", "--force", str(worktree), commit)
    failed_launches = 0
    values: dict[str, Any] = {}  # each run's metric values, computed once
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
            check_base_jobs(files["base"], args.base)  # before either side runs
        for i in range(rounds):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            for side in order:
                code = run_side(side, trees[side], files[side], out, i, rounds,
                                own_code=users is None, close_wait_s=close_wait_s)
                failed_launches += side == "current" and code != 0
                if side == "base" and code != 0 and not any(
                        r.status == "completed" for r in load(out, "base")):
                    raise UsageError(f"--base {args.base}", "its tree ran none of the "
                                     f"suite's runs to the end (exit {code}; the launch's "
                                     f"log: {out / 'logs' / f'base-{i}.log'}): nothing to "
                                     "compare the working tree with")
            if args.repeats is None and MIN_ROUNDS <= i + 1 < rounds:
                why = stop_after(compare_paired(load(out, "base"), load(out, "current"),
                                                settings, values), rounds)
                if why:
                    say(f"hetbench ci: {why}: stopping")
                    break
    finally:
        git(repo, "worktree", "remove", "--force", str(worktree), check=False)
        shutil.rmtree(worktree, ignore_errors=True)
    comparison = compare_paired(load(out, "base"), load(out, "current"), settings, values)
    gate_report.report(comparison, out / "base", out / "current", args.json, args.show_all)
    if not args.json:
        print(f"\nagain, every row: hetbench compare {out / 'base'} {out / 'current'} "
              f"--paired --all{passed_on(args)}")
    if not args.no_baseline:
        against_baseline(args.baseline or repo / "results" / "baselines" / suite.name,
                         out / "current", unpaired_settings(baseline_arguments(args)),
                         args.json)
    crept = [] if args.history is None else kept_in_history(
        args.history, args.history_last, comparison, repo, commit, suite.name)
    if failed_launches:
        # compare leaves failed runs out, so they could pass as `inconclusive`: a tree whose
        # training runs fail has regressed, whatever the timings of the rest say.
        say(f"hetbench ci: {failed_launches} launch(es) of the working tree had runs that did "
            f"not complete (logs in {out / 'logs'}): counted as a regression")
        return 1
    return 1 if crept else int(comparison.exit_status)


def kept_in_history(folder: Path, last: int, comparison: Any, repo: Path, base: str,
                    suite: str) -> list[str]:
    """This gate written to the history folder; the drifts over the chain of gates it ends
    (analysis/tables/gate_history.py), said on stderr. Returns them (a drift fails the
    gate)."""
    from hetbench.analysis.tables import gate_history

    head = git(repo, "rev-parse", "HEAD")
    dirty = bool(git(repo, "status", "--porcelain", "--untracked-files=no", check=False))
    path = gate_history.write_entry(folder, gate_history.entry(comparison, head, base, suite,
                                                               dirty))
    gates = gate_history.chain(gate_history.read_history(folder), suite, last)
    crept = gate_history.findings(gate_history.drift(gates))
    found = ("; ".join(crept) + ": DRIFT, counted as a regression") if crept else \
        "no drift shown"
    say(f"hetbench ci: kept in {path}{' (a dirty working tree)' if dirty else ''}; "
        f"{len(gates)} gate(s) of {suite} in a chain of commits: {found}")
    return crept


def check_base_jobs(suite_file: Path, base: str) -> None:
    """The base tree's jobs (a user's suite moved into its worktree) made and checked as
    the working tree's are: a base that lacks the model, or whose model does not build,
    is refused before anything runs."""
    try:
        check_jobs(load_suite(str(suite_file)))
    except UsageError as exc:
        raise UsageError(f"--base {base}", f"its tree cannot run the suite's jobs: {exc}") \
            from None


def load(out: Path, side: str) -> list[Any]:
    from hetbench.analysis.tables.compare import load_group

    return load_group(out / side) if (out / side).is_dir() else []


def passed_on(args: argparse.Namespace) -> str:
    """The statistics options given to the gate, as `hetbench compare` takes them."""
    out = ""
    for flag, value in (("--threshold", args.threshold), ("--alpha", args.alpha),
                        ("--metrics", args.metrics or None)):
        if value is not None:
            out += f" {flag} {value}"
    return out + "".join(f" --metric-threshold {t}" for t in args.metric_threshold)


def baseline_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """The committed baseline is one launch of many repeats, not rounds: compared unpaired,
    on step time, samples/s and each worker's compute, the defaults of `hetbench compare`
    otherwise."""
    return argparse.Namespace(threshold=None, alpha=None, metric_threshold=[],
                              metrics=BASELINE_METRICS)


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
