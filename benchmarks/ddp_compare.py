"""hetbench versus torch DistributedDataParallel, 2 CPU workers, equal partitions, same
model, data and initial weights. Runs alternate (hetbench, DDP, hetbench, DDP, ...) so
machine drift hits both; prints the ratio of median step times and the parameter difference.

    python benchmarks/ddp_compare.py [--steps 300] [--repeats 3]

Step time is DESIGN.md's: latest end minus earliest begin over the workers, per step.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness.config import parse_suite
from harness.launch import run_suite
from harness.results import load_run

REPO = Path(__file__).resolve().parent.parent


def hetbench_step_times(out: Path, steps: int, warmup: int) -> tuple[np.ndarray, dict]:
    suite = parse_suite({
        "suite": {"name": "ddp-compare"},
        "runs": [{"name": "hetbench", "steps": steps, "warmup_steps": warmup,
                  "workers": [{"device": "cpu"}, {"device": "cpu"}]}],
    })
    (result,) = run_suite(suite, out)
    run = load_run(result.run_dir)
    per_step = run.steps[run.steps["step"] >= warmup].groupby("step").agg(
        begin=("begin_ns", "min"), end=("end_ns", "max"))
    return (per_step["end"] - per_step["begin"]).to_numpy(), dict(
        np.load(result.run_dir / "params.npz"))


def ddp_step_times(out: Path, steps: int, warmup: int) -> tuple[np.ndarray, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", str(REPO / "benchmarks" / "ddp_worker.py"),
                    "--steps", str(steps), "--out", str(out)],
                   check=True, cwd=REPO, env=env, capture_output=True)
    times = np.stack([np.load(out / f"times-rank{r}.npy") for r in range(2)])
    step_times = times[:, :, 1].max(axis=0) - times[:, :, 0].min(axis=0)
    return step_times[warmup:], dict(np.load(out / "params.npz"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            h, h_params = hetbench_step_times(Path(tmp) / f"h{k}", args.steps, args.warmup)
            d, d_params = ddp_step_times(Path(tmp) / f"d{k}", args.steps, args.warmup)
            ours.append(np.median(h))
            theirs.append(np.median(d))
            diff = max(float(np.abs(h_params[n] - d_params[n]).max()) for n in d_params)
            print(f"repeat {k}: hetbench {ours[-1] / 1e6:.3f} ms, DDP {theirs[-1] / 1e6:.3f} ms, "
                  f"ratio {ours[-1] / theirs[-1]:.3f}, max |param diff| {diff:.2e}")
    ratio = np.median(ours) / np.median(theirs)
    print(f"median step time: hetbench {np.median(ours) / 1e6:.3f} ms, "
          f"DDP {np.median(theirs) / 1e6:.3f} ms, ratio {ratio:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
