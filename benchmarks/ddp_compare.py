"""hetbench versus torch DistributedDataParallel, 2 CPU workers, equal partitions, same
model, data and initial weights. Runs alternate (hetbench, DDP without overlap, DDP with
overlap, hetbench, ...) so machine drift hits all; prints the ratios of median step times
and the parameter differences.

    python benchmarks/ddp_compare.py [--workload resnet --size small] [--steps 300]
                                     [--repeats 3] [--variants hetbench,ddp,ddp-overlap]

Variants: `hetbench` (`hetbench run`: its launcher starts, samples and watches the
workers), `hetbench-bare` (the same with instrument = false: begin and end only),
`hetbench-torchrun` (hetbench's workers started by torchrun, as DDP's are: no launcher),
`hetbench-ddp` and `hetbench-ddp-overlap` (`hetbench run` with the `ddp` aggregator: DDP
inside hetbench's loop, with DDP's buckets of the two below), `hetbench-ddp-overlap-timed`
(the latter with `comm_hook = "timed"`, hetbench's Python hook: held to DDP's pyhook),
`hetbench-bare-ddp-overlap` (the latter with instrument = false), `ddp`,
`ddp-overlap`, `ddp-overlap-pyhook` (DDP with torch's own Python all-reduce hook,
`default_hooks.allreduce_hook`: what a comm hook in Python costs, hetbench's or not).

DDP without overlap: one bucket larger than the model, so its all-reduce starts after the
whole backward, as hetbench's phase-separated step does. DDP with overlap: buckets of an
eighth of the model, so the all-reduce of the last layers runs while the first layers'
backward still computes (hetbench's `ddp` aggregator does the same). Targets (issue 28):
each hetbench variant at most 1.02x the DDP variant that exchanges as it does. Every
variant's workers keep the memory a step frees (hetbench's `keep_freed_memory`, glibc's
thresholds in DDP's environment) unless `--glibc-defaults`: glibc's own thresholds move
with each process's allocation history, and faulting freed memory back in cost one
process several times what it cost another (harness/system/allocator.py).

Step time is DESIGN.md's: latest end minus earliest begin over the workers, per step. The
period (earliest begin to the next step's earliest begin) adds what runs between steps
(hetbench writes its records there). Per variant, the phases of a step as each worker
measured them (medians, ms): `forward` (the batch and the forward with the loss),
`backward + exchange` (until the summed gradients are in place: DDP's backward with its
all-reduce; hetbench's backward, pack and exchange), `update` (the optimizer; hetbench's
unpack and apply) and `between` (the rest of the period): where a variant's time goes.
`--pin` puts every variant's worker r on core r alone, its threads with it.

`--job REF --project DIR` compares on a user's job instead (a `hetbench.Job` factory, e.g.
`--job model:make --project examples/classifier`): hetbench runs it as a suite naming it
would, DDP's side is the plain loop its owner would write (benchmarks/ddp_job_worker.py),
both reading the same global batches through torch's DataLoader with `--loader-workers`
processes each (0: in the training process).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hetbench.harness.records.results import load_run
from hetbench.harness.run.launcher import run_suite
from hetbench.harness.spec.suite import parse_suite
from hetbench.harness.spec.tables import suite_text
from hetbench.harness.system import allocator

REPO = Path(__file__).resolve().parent.parent


def hetbench_run(args: argparse.Namespace, instrument: bool = True,
                 bucket_mb: float | None = None, comm_hook: str = "builtin") -> dict:
    """The one-run suite; with `bucket_mb`, its exchange is hetbench's `ddp` aggregator."""
    run = {"name": "hetbench", "steps": args.steps, "warmup_steps": args.warmup,
           "lr": args.lr, "workload": args.workload, "size": args.size,
           "instrument": instrument, "keep_freed_memory": not args.glibc_defaults,
           "workers": [{"device": "cpu", "cores": [r]} if args.pin else {"device": "cpu"}
                       for r in range(2)]}
    if args.job:
        del run["size"]
        run.update(workload=args.job, project=str(args.project.resolve()),
                   global_batch=args.global_batch)
        if args.loader_workers:
            run["loader"] = {"workers": args.loader_workers, "prefetch": args.prefetch}
    if bucket_mb is not None:
        run["aggregator"] = {"name": "ddp", "bucket_mb": bucket_mb, "comm_hook": comm_hook}
    if args.dataset:
        run["dataset"] = args.dataset
    return {"suite": {"name": "ddp-compare"}, "runs": [run]}


PHASE_NAMES = ("forward", "backward + exchange", "update", "between")
PERCENTILES = (10, 25, 50, 75, 90)


class Taken(NamedTuple):
    """One variant's run: per step (after warm-up) its step time and period, ns; the
    median of each phase in PHASE_NAMES over its workers' steps, ns; its final parameters."""

    step_ns: np.ndarray
    period_ns: np.ndarray
    phases_ns: list[float]
    params: dict


def taken_from_marks(marks: np.ndarray, params: dict) -> Taken:
    """From marks[rank, step, k], ns: k = 0 the step's begin, 1 the forward's end, 2 the
    gradients summed in place, 3 the update's end (NaN where not measured: hetbench's
    instrument = false); the warm-up steps already cut off."""
    begin, end = marks[:, :, 0].min(axis=0), marks[:, :, 3].max(axis=0)
    parts = np.diff(marks, axis=2)  # [rank, step, phase]
    between = marks[:, 1:, 0] - marks[:, :-1, 3]
    phases = [float(np.median(parts[:, :, k])) for k in range(3)]
    return Taken(end - begin, np.diff(begin), [*phases, float(np.median(between))], params)


def phase_table(phases: dict[str, list[list[float]]]) -> list[str]:
    """Per variant, the median over repeats of each phase's median, ms."""
    lines = [f"  {'':<26}" + "".join(f"{name:>21}" for name in PHASE_NAMES)]
    for variant, repeats in phases.items():
        values = np.median(np.array(repeats), axis=0) / 1e6
        lines.append(f"  {variant:<26}" + "".join(
            f"{'-' if np.isnan(v) else f'{v:.2f}':>21}" for v in values))
    return lines


def step_times_of(run_dir: Path, warmup: int) -> Taken:
    steps = load_run(run_dir).steps
    steps = steps[steps["step"] >= warmup].sort_values(["rank", "step"])
    ranks = steps["rank"].nunique()
    timed = steps["reduced_ns"] > 0  # instrument = false records begin and end only
    forward_end = steps["begin_ns"] + steps[["load_ns", "to_device_ns", "forward_ns"]].sum(
        axis=1)
    marks = np.stack([steps["begin_ns"], forward_end.where(timed),
                      steps["reduced_ns"].where(timed), steps["end_ns"]], axis=1)
    return taken_from_marks(marks.astype(np.float64).reshape(ranks, -1, 4),
                            dict(np.load(run_dir / "params.npz")))


def hetbench_step_times(out: Path, args: argparse.Namespace, instrument: bool = True,
                        bucket_mb: float | None = None, comm_hook: str = "builtin") -> Taken:
    """`hetbench run`: the launcher starts the workers, samples the host and watches them."""
    (result,) = run_suite(parse_suite(hetbench_run(args, instrument, bucket_mb, comm_hook)),
                          out)
    return step_times_of(result.run_dir, args.warmup)


LAUNCH_TRIES = 2


def torchrun(arguments: list[str], env: dict[str, str], partial: Path) -> None:
    """Two processes under `torchrun --standalone`. A launch that fails is shown (its
    output's last lines) and tried once more, what it wrote to `partial` removed first: a
    CI run on 11-27 lost a whole check to one launch that exited 1 and passed when run
    again by hand; in a later run 2 of 10 DDP launches lost rank 1 to SIGABRT (rank 0
    then ended by torchrun), where 18 launches of the same command alone all passed."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", *arguments]
    for attempt in range(1, LAUNCH_TRIES + 1):
        shutil.rmtree(partial, ignore_errors=True)
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=1800)
        if done.returncode == 0:
            return
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-60:])
        print(f"launch {attempt} of {LAUNCH_TRIES} exited {done.returncode}: "
              f"{' '.join(arguments[:1])}\n{tail}", flush=True)
    raise SystemExit(f"torchrun failed {LAUNCH_TRIES} times: {' '.join(command)}")


def hetbench_torchrun_step_times(out: Path, args: argparse.Namespace) -> Taken:
    """hetbench's workers started by torchrun, as DDP's are: no launcher, no sampler."""
    out.mkdir(parents=True, exist_ok=True)
    toml = out / "suite.toml"
    toml.write_text(_toml(hetbench_run(args)))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    torchrun(["-m", "hetbench.harness.loop.worker", "--suite", str(toml), "--run-name", "hetbench",
              "--out", str(out / "results")], env, out / "results")
    (run_dir,) = [p for p in (out / "results" / "ddp-compare").iterdir() if p.is_dir()]
    return step_times_of(run_dir, args.warmup)


def _toml(suite: dict) -> str:
    """The little suite above as TOML (torchrun mode reads a suite file)."""
    return suite_text(suite["suite"]["name"], "", 1, suite["runs"])


def ddp_step_times(out: Path, args: argparse.Namespace, bucket_mb: float,
                   python_hook: bool = False) -> Taken:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    if not args.glibc_defaults:  # glibc keeps freed memory, as in hetbench's workers
        env.update(allocator.ENVIRONMENT)
    if args.job:
        command = [str(REPO / "benchmarks" / "ddp_job_worker.py"), "--job", args.job,
                   "--project", str(args.project.resolve()), "--steps", str(args.steps),
                   "--global-batch", str(args.global_batch), "--lr", str(args.lr),
                   "--loader-workers", str(args.loader_workers), "--prefetch",
                   str(args.prefetch), "--bucket-mb", str(bucket_mb), "--out", str(out)]
        if python_hook:
            raise SystemExit("ddp-overlap-pyhook is not offered with --job")
        if args.pin:
            command.append("--pin")
        torchrun(command, env, out)
        marks = np.stack([np.load(out / f"times-rank{r}.npy") for r in range(2)])
        return taken_from_marks(marks[:, args.warmup:], dict(np.load(out / "params.npz")))
    command = [str(REPO / "benchmarks" / "ddp_worker.py"),
               "--steps", str(args.steps), "--out", str(out), "--workload", args.workload,
               "--size", args.size, "--lr", str(args.lr), "--bucket-mb", str(bucket_mb)]
    if args.dataset:
        command += ["--dataset", args.dataset]
    if python_hook:
        command.append("--python-hook")
    if args.pin:
        command.append("--pin")
    torchrun(command, env, out)
    marks = np.stack([np.load(out / f"times-rank{r}.npy") for r in range(2)])
    return taken_from_marks(marks[:, args.warmup:], dict(np.load(out / "params.npz")))


def model_mb(args: argparse.Namespace) -> float:
    if args.job:
        from hetbench.workloads.job import make_job

        model = make_job(args.job, args.project.resolve(), 0).model
        return sum(p.numel() for p in model.parameters()) * 4 / 2**20
    from hetbench.workloads import build_spec, get_workload
    from hetbench.workloads.data import load_dataset

    workload = get_workload(args.workload)
    data = load_dataset(args.dataset or workload.default_dataset, args.workload, 0)
    spec = build_spec(args.workload, data.sample_shape, data.num_classes, args.size)
    return spec.num_elements * 4 / 2**20


VARIANTS = ("hetbench", "hetbench-bare", "hetbench-torchrun", "hetbench-ddp",
            "hetbench-ddp-overlap", "hetbench-ddp-overlap-timed", "hetbench-bare-ddp-overlap",
            "ddp", "ddp-overlap",
            "ddp-overlap-pyhook")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--size", default="small")
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--job", default=None, metavar="REF",
                        help="a user's job instead of --workload: its factory, "
                        "'module:name' or 'file.py:name', imported from --project")
    parser.add_argument("--project", type=Path, default=Path("."),
                        help="the folder --job is imported from")
    parser.add_argument("--global-batch", type=int, default=64, help="with --job")
    parser.add_argument("--loader-workers", type=int, default=2,
                        help="with --job: DataLoader processes per worker, both sides")
    parser.add_argument("--prefetch", type=int, default=2,
                        help="with --job: batches each DataLoader process makes ahead")
    parser.add_argument("--variants", default="hetbench,ddp,ddp-overlap",
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--pin", action="store_true",
                        help="every variant's worker r on core r alone (hetbench's `cores`), "
                        "so that no run's speed depends on where the scheduler put its workers")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="every variant with glibc's own malloc thresholds (hetbench's "
                        "keep_freed_memory = false); by default every variant keeps the "
                        "memory a step frees (harness/system/allocator.py)")
    parser.add_argument("--fail-above", type=float, default=None, metavar="R",
                        help="exit 1 when, for a hetbench variant against the DDP one that "
                        "exchanges as it does (hetbench-ddp-overlap: ddp-overlap; the others: "
                        "ddp), even the low end of the ratio's 95%% interval is above R "
                        "(CI: .ci/run)")
    args = parser.parse_args()
    if args.fail_above is not None and args.repeats < 2:
        parser.error("--fail-above needs --repeats of at least 2 (an interval)")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in variants if v not in VARIANTS]:
        parser.error(f"--variants: unknown {unknown[0]!r} (allowed: {', '.join(VARIANTS)})")
    size_mb = model_mb(args)
    buckets = {"ddp": 4 * size_mb + 1, "ddp-overlap": max(size_mb / 8, 0.01)}
    take = {
        "hetbench": lambda out: hetbench_step_times(out, args),
        "hetbench-bare": lambda out: hetbench_step_times(out, args, instrument=False),
        "hetbench-torchrun": lambda out: hetbench_torchrun_step_times(out, args),
        "hetbench-ddp": lambda out: hetbench_step_times(out, args, bucket_mb=buckets["ddp"]),
        "hetbench-ddp-overlap": lambda out: hetbench_step_times(
            out, args, bucket_mb=buckets["ddp-overlap"]),
        "hetbench-ddp-overlap-timed": lambda out: hetbench_step_times(
            out, args, bucket_mb=buckets["ddp-overlap"], comm_hook="timed"),
        "hetbench-bare-ddp-overlap": lambda out: hetbench_step_times(
            out, args, instrument=False, bucket_mb=buckets["ddp-overlap"]),
        "ddp": lambda out: ddp_step_times(out, args, buckets["ddp"]),
        "ddp-overlap": lambda out: ddp_step_times(out, args, buckets["ddp-overlap"]),
        "ddp-overlap-pyhook": lambda out: ddp_step_times(out, args, buckets["ddp-overlap"],
                                                         python_hook=True),
    }
    medians: dict[str, list[float]] = {v: [] for v in variants}
    periods: dict[str, list[float]] = {v: [] for v in variants}
    spreads: dict[str, list[float]] = {v: [] for v in variants}
    phases: dict[str, list[list[float]]] = {v: [] for v in variants}
    percentiles: dict[str, list[np.ndarray]] = {v: [] for v in variants}
    subject = args.job if args.job else f"{args.workload} {args.size}"
    print(f"{subject}: {size_mb:.2f} MB of gradients; DDP buckets "
          f"{buckets['ddp']:.3g} MB (ddp: no overlap), {buckets['ddp-overlap']:.3g} MB "
          "(ddp-overlap)")
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            order = variants[k % len(variants):] + variants[:k % len(variants)]
            params: dict[str, dict] = {}
            for variant in order:  # each repeat starts one variant later: no fixed order
                taken = take[variant](Path(tmp) / f"{variant}-{k}")
                times, params[variant] = taken.step_ns, taken.params
                medians[variant].append(float(np.median(times)))
                periods[variant].append(float(np.median(taken.period_ns)))
                q1, q3 = np.percentile(times, [25, 75])
                spreads[variant].append(float((q3 - q1) / np.median(times)))
                phases[variant].append(taken.phases_ns)
                percentiles[variant].append(np.percentile(times, PERCENTILES))
            reference = params[variants[0]]
            diff = max(float(np.abs(reference[n] - p[n]).max())
                       for p in params.values() for n in p)
            print(f"repeat {k}: " + ", ".join(f"{v} {medians[v][-1] / 1e6:.2f} ms"
                                               for v in variants)
                  + f"; max |param diff| {diff:.1e}", flush=True)
    print(f"\nmedian step (ms), step-to-step spread (IQR / median) and period (ms) over "
          f"{args.repeats} repeats:")
    for v in variants:
        print(f"  {v:<26} {np.median(medians[v]) / 1e6:8.2f} ms   spread "
              f"{np.median(spreads[v]):.3f}   period {np.median(periods[v]) / 1e6:8.2f} ms")
    print("\nstep time percentiles (ms, " + ", ".join(f"p{p}" for p in PERCENTILES)
          + "; medians over repeats): where the spread comes from")
    for v in variants:
        values = np.median(np.array(percentiles[v]), axis=0) / 1e6
        print(f"  {v:<26} " + " ".join(f"{x:8.2f}" for x in values))
    print("\nphases of a worker's step (ms, medians):")
    print("\n".join(phase_table(phases)))
    lines, slower = ratio_lines(medians, args.fail_above)
    print("\n".join(lines))
    if slower:
        print(f"FAIL: slower than DDP beyond {args.fail_above}: {'; '.join(slower)}")
        sys.exit(1)


# the DDP variant each hetbench variant is held to: the one that exchanges as it does
COUNTERPART = {"hetbench": "ddp", "hetbench-bare": "ddp", "hetbench-torchrun": "ddp",
               "hetbench-ddp": "ddp", "hetbench-ddp-overlap": "ddp-overlap",
               "hetbench-ddp-overlap-timed": "ddp-overlap-pyhook",
               "hetbench-bare-ddp-overlap": "ddp-overlap"}


def ratio_lines(medians: dict[str, list[float]], fail_above: float | None
                ) -> tuple[list[str], list[str]]:
    """Per pair (a hetbench variant over a DDP one): the ratio of the repeats' median step
    times, its interval and each repeat's; and the pairs of a variant and its COUNTERPART
    whose interval lies wholly above `fail_above` (none when it is None)."""
    lines, slower = [], []
    # hetbench's variants over DDP's, and DDP with a Python hook over DDP without
    for ours in (v for v in medians if v.startswith("hetbench") or v == "ddp-overlap-pyhook"):
        for theirs in (v for v in medians if v.startswith("ddp") and v != ours):
            ratios = [o / t for o, t in zip(medians[ours], medians[theirs], strict=True)]
            low, high = median_interval(np.array(ratios))
            lines.append(f"{ours} / {theirs}: ratio {np.median(ratios):.3f}, 95% interval "
                         f"{low:.3f}-{high:.3f} (per repeat "
                         f"{', '.join(f'{r:.3f}' for r in ratios)})")
            if fail_above is not None and low > fail_above and COUNTERPART.get(ours) == theirs:
                slower.append(f"{ours} / {theirs} (interval from {low:.3f})")
    return lines, slower


def median_interval(values: np.ndarray, n_boot: int = 4000) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the median of paired per-repeat ratios."""
    if len(values) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(0)
    draws = np.median(values[rng.integers(0, len(values), (n_boot, len(values)))], axis=1)
    low, high = np.quantile(draws, [0.025, 0.975])
    return float(low), float(high)


if __name__ == "__main__":
    main()
