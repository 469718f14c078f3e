"""`hetbench run [SUITE]`: run a suite (TOML file or built-in name), print a summary per run."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetbench.harness.cli import arguments, hosts
from hetbench.harness.cli.progress import clock
from hetbench.harness.records import manifest
from hetbench.harness.run import links
from hetbench.harness.run.jobcheck import check_jobs
from hetbench.harness.spec import profiling
from hetbench.harness.spec.builtin import builtin_suites
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import Overrides, RunSpec, SuiteSpec, load_suite

if TYPE_CHECKING:  # loaded on use: nodes loads torch.distributed
    from hetbench.harness.run.nodes import Nodes, Place

DEFAULT_SUITE = "quick"


def add_arguments(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("suite", nargs="?", default=DEFAULT_SUITE,
                        help=f"suite TOML file or built-in name: {', '.join(builtin_suites())}"
                        f" (default: {DEFAULT_SUITE}; `hetbench suites` says what each is)")
    parser.add_argument("--repeats", type=int, help="override the suite's repeats")
    parser.add_argument("--steps", type=int, help="override every run's steps")
    arguments.add_run_filter(parser, "only the runs")
    parser.add_argument("--out", type=arguments.folder, default=Path("results"),
                        help="results folder (default: results/)")
    parser.add_argument("--skip-unavailable", action="store_true",
                        help="skip runs whose devices this host lacks (recorded as skipped)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-figures", action="store_true",
                        help="draw no figures at the end (16 s for the quick suite's on two "
                        "cores; `hetbench figures` draws them later)")
    add_host_arguments(parser)


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a run across hosts (`run`, `launch`)."""
    group = parser.add_argument_group(
        "across hosts", "run the same command on every host (docs/howto/multi-host.md); "
        "under srun, absent flags are read from SLURM's environment")
    group.add_argument("--nnodes", type=int, help="how many hosts run the suite (default 1)")
    group.add_argument("--node-rank", type=int, help="this host's number, 0 to NNODES-1")
    group.add_argument("--master-addr", help="node 0's address, where its launcher listens")
    group.add_argument("--master-port", type=int,
                       help=f"the port node 0's launcher listens on (default {hosts.MASTER_PORT})")
    group.add_argument("--join-timeout", type=float, default=hosts.JOIN_TIMEOUT_S,
                       metavar="SECONDS",
                       help="how long the hosts wait for each other to join "
                       f"(default {hosts.JOIN_TIMEOUT_S:g})")


class StepProgress:
    """A tqdm bar fed absolute step counts (the launcher reads them from the part files)."""

    def __init__(self, total: int | None, label: str, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=label, unit="step", disable=not enabled,
                        leave=False, file=sys.stderr)

    def update(self, done: int) -> None:
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def run(args: argparse.Namespace) -> int:
    return run_and_collect(args, [])


def run_written(suite_path: Path, out: Path, no_figures: bool = False) -> tuple[int, list[Any]]:
    """`hetbench run SUITE --out OUT` of a suite another command wrote (advise --verify,
    explain): its status and its completed runs, loaded (results.Run)."""
    from hetbench.harness.records.results import load_run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([str(suite_path), "--out", str(out), "--no-progress",
                              *(["--no-figures"] if no_figures else [])])
    results: list[Any] = []
    status = run_and_collect(args, results)
    return status, [load_run(Path(r.run_dir)) for r in results if r.status == "completed"]


def run_and_collect(args: argparse.Namespace, collected: list[Any]) -> int:
    """`hetbench run`, each run's result (launcher.RunResult) added to `collected`."""
    from hetbench.harness.records.results import writable_folder
    from hetbench.harness.run.launcher import check_open_files

    suite = load_suite(args.suite, Overrides(args.repeats, args.steps,
                                             tuple(args.runs or ()) or None,
                                             getattr(args, "script", None),
                                             getattr(args, "script_args", ())))
    check_open_files()
    place = hosts.place(args, suite)
    if place is None:
        refuse_interfaces(suite)
    node = None if place is None else place.node_rank
    gpu_counts = None if args.skip_unavailable else refuse_missing_devices(suite, node)
    check_jobs(suite)  # a user's factory made and checked, in a process of its own
    refuse_unreadable_runs(args.out / suite.name)
    writable_folder(args.out / suite.name, "--out")  # the suite's own folder, before its banner
    with contextlib.ExitStack() as launch:
        nodes = None
        if place is not None:  # this host's link shaped for the launch, where it can be
            link = launch.enter_context(links.shaped(suite, place.node_rank, hosts.address(place)))
            nodes = hosts.join(place, suite, link)
        return _run_suite(args, suite, place, nodes, gpu_counts, collected)


def _run_suite(args: argparse.Namespace, suite: SuiteSpec, place: Place | None,
               nodes: Nodes | None,
               gpu_counts: dict[str, int] | None, collected: list[Any]) -> int:
    from hetbench.harness.records.rundir import core_load
    from hetbench.harness.run.launcher import run_suite

    where = "" if place is None else f" (node {place.node_rank} of {place.nnodes})"
    print(f"suite {suite.name}: {len(suite.runs)} run(s) x {suite.repeats} repeat(s) -> "
          f"{args.out / suite.name}{where}")
    # the step bar redraws a line: only for a person watching a terminal
    show_progress = not args.no_progress and sys.stderr.isatty()
    total, clock = len(suite.runs) * suite.repeats, SuiteClock()

    def on_start(run_spec: RunSpec, repeat: int) -> None:
        workers = ", ".join(_worker_text(w) for w in run_spec.workers)
        what = (f"script {' '.join([Path(run_spec.script).name, *run_spec.args])}"
                if run_spec.script is not None else f"{run_spec.framework} "
                f"{run_spec.workload}/{run_spec.dataset}, {run_spec.steps} steps")
        print(f"\n== [{clock.started(total)}] {run_spec.name} (repeat {repeat}): {what}, "
              f"batch {run_spec.global_batch}, {run_spec.partition.policy}, "
              f"{run_spec.aggregator.name}; {workers}", flush=True)
        if (demand := core_load(run_spec))["oversubscribed"]:
            print(f"   warning: {demand['worker_threads']} worker threads computing on "
                  f"{demand['cpu_demand']:g} of {demand['cores']} cores (load average "
                  f"{demand['load_average_1m']}): oversubscribed, every timing includes "
                  "waiting for a core", flush=True)

    holder = place is None or place.coordinator  # of the run directories
    results = run_suite(
        suite, args.out, skip_unavailable=args.skip_unavailable, on_start=on_start,
        on_end=print_result if holder else print_share,
        # a script's run takes as many steps as its script does: counted, no total
        progress_factory=lambda r: StepProgress(None if r.is_loop else r.steps, r.name,
                                                show_progress),
        gpu_counts=gpu_counts, nodes=nodes,
    )
    collected.extend(results)
    if not holder:
        return _share_summary(results, args.out / suite.name)
    try:
        figures = [] if args.no_figures else \
            write_figures(suite.name, results, args.out / suite.name / "figures")
    except OSError as exc:  # a full disk: the runs are recorded, only their figures are not
        figures = []
        print(f"hetbench: could not write the figures ({exc.filename or args.out}: "
              f"{exc.strerror or exc}); `hetbench figures` draws them later", file=sys.stderr)
    outcomes, failed = outcome_counts(results)
    print(f"\n{outcomes}; results in {args.out / suite.name}")
    if figures:
        print(f"figures: {', '.join(p.name for p in figures)} (PNG and PDF) in {figures[0].parent}")
    elif args.no_figures:
        folder = args.out / suite.name
        print(f"figures: none drawn (--no-figures; hetbench figures {folder} "
              f"--out {folder / 'figures'})")
    print(SUMMARY_DEFINITIONS)
    print(f"full analysis: hetbench report {args.out / suite.name}")
    return 1 if failed else 0


def print_share(result: Any) -> None:
    """How a run across hosts ended, on a host other than node 0 (which holds the run)."""
    print(f"   {result.status}{': ' + result.reason if result.reason else ''}  "
          f"[this host's parts and logs: {result.run_dir}]")


def _share_summary(results: list[Any], suite_dir: Path) -> int:
    outcomes, failed = outcome_counts(results)
    print(f"\n{outcomes}; node 0 holds the runs, this host its parts of them in {suite_dir}")
    return 1 if failed else 0


def outcome_counts(results: list[Any]) -> tuple[str, bool]:
    """'2 completed, 1 failed' of the suite's runs, and whether any failed."""
    counts = Counter(result.status for result in results)
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items())), \
        bool(counts.get("failed"))


def refuse_interfaces(suite: Any) -> None:
    """`interface` names what listeners bind across hosts (torchrun mode); `hetbench run`
    keeps a run on this host, over loopback, where it would be recorded and not used."""
    for i, run_spec in enumerate(suite.runs):
        if run_spec.interface is not None:
            raise UsageError(f"runs[{i}].interface",
                             f"{run_spec.interface!r} is for runs across hosts (torchrun "
                             "mode, docs/howto/multi-host.md); `hetbench run` runs on this "
                             "host over loopback: remove it")


def refuse_unreadable_runs(suite_dir: Path) -> None:
    """The runs already in the suite's folder must be ones hetbench reads: a run added
    beside a damaged manifest, or one of a newer hetbench, would make every later report
    of the folder fail. Refused, naming it, rather than moved aside: nothing of a
    user's results is moved without being asked."""
    for found in sorted(suite_dir.glob(f"*/{manifest.MANIFEST_FILE}")):
        try:
            manifest.read(found.parent)
        except UsageError as exc:
            raise UsageError(exc.where, f"{exc.message}; `hetbench run` adds no run beside a "
                             "run it cannot read: move it aside or choose another --out"
                             ) from None


def refuse_missing_devices(suite: Any, node: int | None = None) -> dict[str, int]:
    """Raise DeviceUnavailable for the first worker whose device, cores or framework this
    host lacks, before --out is created or anything printed: a refused suite leaves
    nothing behind. (run_suite asks again, and with --skip-unavailable records such runs
    as skipped, so then there is nothing to refuse here.)"""
    from hetbench.harness.run.launcher import check_devices

    gpu_counts: dict[str, int] = {}
    for i, run_spec in enumerate(suite.runs):
        check_devices(run_spec, f"runs[{i}]", gpu_counts, node)
    return gpu_counts  # the GPUs each framework sees: probing again would start it again


class SuiteClock:
    """Where a suite stands as each run starts: run i of N, time elapsed, and an estimate
    of the time left (the mean time of the runs so far, times the runs to go)."""

    def __init__(self) -> None:
        self.begin, self.done = time.monotonic(), 0

    def started(self, total: int) -> str:
        elapsed = time.monotonic() - self.begin
        text = f"run {self.done + 1} of {total}, {clock(elapsed)} elapsed"
        if self.done:
            text += f", about {clock(elapsed / self.done * (total - self.done))} left"
        self.done += 1
        return text


SUMMARY_DEFINITIONS = (
    "(samples/s: the samples of the steps after warm-up over the wall time from the first "
    "one's begin to the last one's end, pauses between steps included; mean step: each "
    "step's first begin to its last end, averaged; compute / communication / idle: shares "
    "of the workers' summed begin-to-end time)")


def _worker_text(w: Any) -> str:
    text = f"{w.device} x{w.threads}"
    if w.slowdown != 1.0:
        text += f" slowdown {w.slowdown:g}"
    if w.jitter:
        text += f" jitter {w.jitter[1]:g}x p{w.jitter[0]:g}"
    return text


def print_result(result: Any) -> None:
    from hetbench.analysis.view.metrics import loss_not_finite, run_summary, worker_summary
    from hetbench.harness.records.results import load_run

    print(f"   {result.status}{': ' + result.reason if result.reason else ''}  "
          f"[{result.run_dir}]")
    if result.status == "skipped":
        return
    data = load_run(result.run_dir)
    summary = run_summary(data.steps, data.warmup_steps)
    history = data.manifest.get("partition_history") or [{}]
    print(f"   {summary['steps']} steps after warm-up: {summary['samples_per_s']:.0f} samples/s, "
          f"mean step {summary['mean_step_ms']:.2f} ms, compute {summary['compute_share']:.0%}"
          f" / communication {summary['comm_share']:.0%} / idle {summary['idle_fraction']:.1%}"
          f" of worker time; partition {history[0].get('sizes')}"
          + (f" -> {history[-1].get('sizes')} ({len(history) - 1} change(s))"
             if len(history) > 1 else ""))
    if (not_finite := loss_not_finite(data.steps, "imported" not in data.manifest)):
        print(f"   warning: {not_finite}")
    if (held_out := _held_out_line(data)) is not None:
        print(held_out)
    if (profiled := _profile_line(data)) is not None:
        print(profiled)
    workers = worker_summary(data.steps, data.warmup_steps)
    if len(workers):
        print("   worker  slice  compute mean ms  compute CV  idle mean ms")
        for row in workers.itertuples(index=False):
            print(f"   {row.rank:>6}  {row.batch_size:>5.0f}  {row.compute_mean_ms:>15.2f}  "
                  f"{row.compute_cv:>10.3f}  {row.idle_mean_ms:>12.2f}")


def _profile_line(data: Any) -> str | None:
    """Where the profiler's traces are, and which steps the summary leaves out for them."""
    from hetbench.harness.loop.profiling import PROFILE_DIR

    window = data.manifest["run"].get("profile")
    if not window:
        return None
    traces = sorted((data.run_dir / PROFILE_DIR).glob("rank*"))
    return (f"   profiled {profiling.describe(window)}: {len(traces)} "
            f"trace(s) in {PROFILE_DIR}/ (steps {window['first']}-{window['last'] + 1} left "
            "out of the summary)")


def _held_out_line(data: Any) -> str | None:
    """The last held-out evaluation and the time to target, when the run evaluated."""
    from hetbench.analysis.tables.convergence import convergence_row

    row = convergence_row(data)
    if row is None:
        return None
    text = (f"   held-out after step {row['final_step']}: loss {row['final_loss']:.3f}, "
            f"{row['metric'].replace('_', ' ')} {row['final_metric']:.3f}")
    if row["target_metric"]:
        text += (f"; target {row['target_metric']} {row['target']:g} reached at step "
                 f"{row['steps_to_target']:.0f} after {row['time_to_target_s']:.1f} s of "
                 "training" if row["reached"] else f"; target {row['target']:g} not reached")
    return text


def write_figures(suite_name: str, results: list[Any], out: Path) -> list[Path]:
    """The analysis figures for the runs just made (PNG and PDF)."""
    from hetbench.analysis.render.figures import write_all
    from hetbench.harness.records.results import load_run

    loaded = [load_run(r.run_dir) for r in results if r.status != "skipped"]
    return [p for p in write_all(loaded, out) if p.suffix == ".png"]
