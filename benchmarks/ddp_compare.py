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
and a comm hook inside hetbench's loop, with DDP's buckets of the two below), `ddp`,
`ddp-overlap`, `ddp-overlap-pyhook` (DDP with torch's own Python all-reduce hook,
`default_hooks.allreduce_hook`: what a comm hook in Python costs, hetbench's or not).

DDP without overlap: one bucket larger than the model, so its all-reduce starts after the
whole backward, as hetbench's phase-separated step does (the target: hetbench at most 1.05x
of it). DDP with overlap: buckets of an eighth of the model, so the all-reduce of the last
layers runs while the first layers' backward still computes (the gap hetbench's loop does
not close, reported). Step time is DESIGN.md's: latest end minus earliest begin over the
workers, per step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness.records.results import load_run
from harness.run.launcher import run_suite
from harness.spec.suite import parse_suite

REPO = Path(__file__).resolve().parent.parent


def hetbench_run(args: argparse.Namespace, instrument: bool = True,
                 bucket_mb: float | None = None) -> dict:
    """The one-run suite; with `bucket_mb`, its exchange is hetbench's `ddp` aggregator."""
    run = {"name": "hetbench", "steps": args.steps, "warmup_steps": args.warmup,
           "lr": args.lr, "workload": args.workload, "size": args.size,
           "instrument": instrument, "workers": [{"device": "cpu"}, {"device": "cpu"}]}
    if bucket_mb is not None:
        run["aggregator"] = {"name": "ddp", "bucket_mb": bucket_mb}
    if args.dataset:
        run["dataset"] = args.dataset
    return {"suite": {"name": "ddp-compare"}, "runs": [run]}


def step_times_of(run_dir: Path, warmup: int) -> tuple[np.ndarray, dict]:
    run = load_run(run_dir)
    per_step = run.steps[run.steps["step"] >= warmup].groupby("step").agg(
        begin=("begin_ns", "min"), end=("end_ns", "max"))
    return (per_step["end"] - per_step["begin"]).to_numpy(), dict(
        np.load(run_dir / "params.npz"))


def hetbench_step_times(out: Path, args: argparse.Namespace, instrument: bool = True,
                        bucket_mb: float | None = None) -> tuple[np.ndarray, dict]:
    """`hetbench run`: the launcher starts the workers, samples the host and watches them."""
    (result,) = run_suite(parse_suite(hetbench_run(args, instrument, bucket_mb)), out)
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


def hetbench_torchrun_step_times(out: Path, args: argparse.Namespace
                                 ) -> tuple[np.ndarray, dict]:
    """hetbench's workers started by torchrun, as DDP's are: no launcher, no sampler."""
    out.mkdir(parents=True, exist_ok=True)
    toml = out / "suite.toml"
    toml.write_text(_toml(hetbench_run(args)))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    torchrun(["-m", "harness.loop.worker", "--suite", str(toml), "--run-name", "hetbench",
              "--out", str(out / "results")], env, out / "results")
    (run_dir,) = [p for p in (out / "results" / "ddp-compare").iterdir() if p.is_dir()]
    return step_times_of(run_dir, args.warmup)


def _toml(suite: dict) -> str:
    """The little suite above as TOML (torchrun mode reads a suite file)."""
    run = suite["runs"][0]
    lines = ['[suite]', 'name = "ddp-compare"', '[[runs]]']
    for key, value in run.items():
        if key == "workers":
            lines.append('workers = [ { device = "cpu" }, { device = "cpu" } ]')
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def ddp_step_times(out: Path, args: argparse.Namespace, bucket_mb: float,
                   python_hook: bool = False) -> tuple[np.ndarray, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    command = [str(REPO / "benchmarks" / "ddp_worker.py"),
               "--steps", str(args.steps), "--out", str(out), "--workload", args.workload,
               "--size", args.size, "--lr", str(args.lr), "--bucket-mb", str(bucket_mb)]
    if args.dataset:
        command += ["--dataset", args.dataset]
    if python_hook:
        command.append("--python-hook")
    torchrun(command, env, out)
    times = np.stack([np.load(out / f"times-rank{r}.npy") for r in range(2)])
    step_times = times[:, :, 1].max(axis=0) - times[:, :, 0].min(axis=0)
    return step_times[args.warmup:], dict(np.load(out / "params.npz"))


def model_mb(args: argparse.Namespace) -> float:
    from workloads import build_spec, get_workload
    from workloads.data import load_dataset

    workload = get_workload(args.workload)
    data = load_dataset(args.dataset or workload.default_dataset, args.workload, 0)
    spec = build_spec(args.workload, data.sample_shape, data.num_classes, args.size)
    return spec.num_elements * 4 / 2**20


VARIANTS = ("hetbench", "hetbench-bare", "hetbench-torchrun", "hetbench-ddp",
            "hetbench-ddp-overlap", "ddp", "ddp-overlap", "ddp-overlap-pyhook")


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
    parser.add_argument("--variants", default="hetbench,ddp,ddp-overlap",
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
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
        "ddp": lambda out: ddp_step_times(out, args, buckets["ddp"]),
        "ddp-overlap": lambda out: ddp_step_times(out, args, buckets["ddp-overlap"]),
        "ddp-overlap-pyhook": lambda out: ddp_step_times(out, args, buckets["ddp-overlap"],
                                                         python_hook=True),
    }
    medians: dict[str, list[float]] = {v: [] for v in variants}
    spreads: dict[str, list[float]] = {v: [] for v in variants}
    print(f"{args.workload} {args.size}: {size_mb:.2f} MB of gradients; DDP buckets "
          f"{buckets['ddp']:.3g} MB (ddp: no overlap), {buckets['ddp-overlap']:.3g} MB "
          "(ddp-overlap)")
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            order = variants[k % len(variants):] + variants[:k % len(variants)]
            params: dict[str, dict] = {}
            for variant in order:  # each repeat starts one variant later: no fixed order
                times, params[variant] = take[variant](Path(tmp) / f"{variant}-{k}")
                medians[variant].append(float(np.median(times)))
                q1, q3 = np.percentile(times, [25, 75])
                spreads[variant].append(float((q3 - q1) / np.median(times)))
            reference = params[variants[0]]
            diff = max(float(np.abs(reference[n] - p[n]).max())
                       for p in params.values() for n in p)
            print(f"repeat {k}: " + ", ".join(f"{v} {medians[v][-1] / 1e6:.2f} ms"
                                               for v in variants)
                  + f"; max |param diff| {diff:.1e}", flush=True)
    print(f"\nmedian step (ms) and step-to-step spread (IQR / median) over {args.repeats} "
          "repeats:")
    for v in variants:
        print(f"  {v:<18} {np.median(medians[v]) / 1e6:8.2f} ms   spread "
              f"{np.median(spreads[v]):.3f}")
    lines, slower = ratio_lines(medians, args.fail_above)
    print("\n".join(lines))
    if slower:
        print(f"FAIL: slower than DDP beyond {args.fail_above}: {'; '.join(slower)}")
        sys.exit(1)


# the DDP variant each hetbench variant is held to: the one that exchanges as it does
COUNTERPART = {"hetbench": "ddp", "hetbench-bare": "ddp", "hetbench-torchrun": "ddp",
               "hetbench-ddp": "ddp", "hetbench-ddp-overlap": "ddp-overlap"}


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
