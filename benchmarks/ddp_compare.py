"""hetbench versus torch DistributedDataParallel, 2 CPU workers, equal partitions, same
model, data and initial weights. Runs alternate (hetbench, DDP without overlap, DDP with
overlap, hetbench, ...) so machine drift hits all; prints the ratios of median step times
and the parameter differences.

    python benchmarks/ddp_compare.py [--workload resnet --size small] [--steps 300]
                                     [--repeats 3]

DDP without overlap: one bucket larger than the model, so its all-reduce starts after the
whole backward, as hetbench's phase-separated step does (the target: hetbench at most 1.05x
of it). DDP with overlap: buckets of an eighth of the model, so the all-reduce of the last
layers runs while the first layers' backward still computes (the gap hetbench's loop does
not close, reported). Step time is DESIGN.md's: latest end minus earliest begin over the
workers, per step.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness.records.results import load_run
from harness.run.launcher import run_suite
from harness.spec.suite import parse_suite

REPO = Path(__file__).resolve().parent.parent


def hetbench_step_times(out: Path, args: argparse.Namespace) -> tuple[np.ndarray, dict]:
    steps, warmup = args.steps, args.warmup
    run = {"name": "hetbench", "steps": steps, "warmup_steps": warmup, "lr": args.lr,
           "workload": args.workload, "size": args.size,
           "workers": [{"device": "cpu"}, {"device": "cpu"}]}
    if args.dataset:
        run["dataset"] = args.dataset
    suite = parse_suite({"suite": {"name": "ddp-compare"}, "runs": [run]})
    (result,) = run_suite(suite, out)
    run = load_run(result.run_dir)
    per_step = run.steps[run.steps["step"] >= warmup].groupby("step").agg(
        begin=("begin_ns", "min"), end=("end_ns", "max"))
    return (per_step["end"] - per_step["begin"]).to_numpy(), dict(
        np.load(result.run_dir / "params.npz"))


def ddp_step_times(out: Path, args: argparse.Namespace, bucket_mb: float
                   ) -> tuple[np.ndarray, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(REPO / "benchmarks" / "ddp_worker.py"),
               "--steps", str(args.steps), "--out", str(out), "--workload", args.workload,
               "--size", args.size, "--lr", str(args.lr), "--bucket-mb", str(bucket_mb)]
    if args.dataset:
        command += ["--dataset", args.dataset]
    subprocess.run(command, check=True, cwd=REPO, env=env, capture_output=True, timeout=1800)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--size", default="small")
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    size_mb = model_mb(args)
    buckets = {"no overlap": 4 * size_mb + 1, "overlap": max(size_mb / 8, 0.01)}
    ours: list[float] = []
    theirs: dict[str, list[float]] = {k: [] for k in buckets}
    print(f"{args.workload} {args.size}: {size_mb:.2f} MB of gradients; DDP buckets "
          + ", ".join(f"{k} {v:.3g} MB" for k, v in buckets.items()))
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            h, h_params = hetbench_step_times(Path(tmp) / f"h{k}", args)
            ours.append(float(np.median(h)))
            line = f"repeat {k}: hetbench {ours[-1] / 1e6:.2f} ms"
            for name, bucket in buckets.items():
                d, d_params = ddp_step_times(Path(tmp) / f"d{k}-{len(line)}", args, bucket)
                theirs[name].append(float(np.median(d)))
                diff = max(float(np.abs(h_params[n] - d_params[n]).max()) for n in d_params)
                line += (f", DDP {name} {theirs[name][-1] / 1e6:.2f} ms (ratio "
                         f"{ours[-1] / theirs[name][-1]:.3f}, max |param diff| {diff:.1e})")
            print(line, flush=True)
    for name in buckets:
        per_repeat = [o / t for o, t in zip(ours, theirs[name], strict=True)]
        print(f"hetbench / DDP {name}: median step {np.median(ours) / 1e6:.2f} / "
              f"{np.median(theirs[name]) / 1e6:.2f} ms, ratio {np.median(per_repeat):.3f} "
              f"(per repeat {', '.join(f'{r:.3f}' for r in per_repeat)})"
              + (" target <= 1.05" if name == "no overlap" else ""))


if __name__ == "__main__":
    main()
