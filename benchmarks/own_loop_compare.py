"""A user's DDP script against the same script converted to hetbench (hetbench.join),
two CPU ranks under torchrun, equal slices: what converting costs a step.

    python benchmarks/own_loop_compare.py [--repeats 5] [--short 20] [--long 120]

Neither script is changed for the measure: each is timed from outside, as a whole process
under torchrun, at two lengths (`--short` and `--long` steps), and its step time is the
difference over the steps between (start-up, data generation, the run directory's
writing and every other one-off cost cancel). Runs alternate (DDP short, DDP long,
hetbench short, hetbench long, then again), so the machine's drift hits both; the ratio
is hetbench's step time over DDP's, per repeat, and its median. Scripts:
examples/own_loop/ddp_train.py and examples/own_loop/train.py (a small CNN with
BatchNorm and dropout, gradient clipping, a scheduler; +8 -10 lines apart).
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

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own_loop"
SCRIPTS = {"ddp": EXAMPLE / "ddp_train.py", "hetbench": EXAMPLE / "train.py"}


def timed_run(script: Path, steps: int, cwd: Path) -> float:
    """Wall seconds of one torchrun job of `script` for `steps` steps."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("HETBENCH_WORKERS", None)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nnodes", "1", "--nproc-per-node", "2", str(script), "--steps",
                    str(steps)], cwd=cwd, env=env, check=True, capture_output=True,
                   timeout=600)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--short", type=int, default=20)
    parser.add_argument("--long", type=int, default=120)
    args = parser.parse_args()
    steps = {name: [] for name in SCRIPTS}  # type: dict[str, list[float]]
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for name, script in SCRIPTS.items():
                short = timed_run(script, args.short, Path(folder))
                long = timed_run(script, args.long, Path(folder))
                steps[name].append((long - short) / (args.long - args.short) * 1e3)
            print(f"repeat {repeat}: " + ", ".join(f"{n} {v[-1]:.2f} ms/step"
                                                   for n, v in steps.items()), flush=True)
    ratios = [h / d for h, d in zip(steps["hetbench"], steps["ddp"], strict=True)]
    for name, values in steps.items():
        print(f"{name}: median {statistics.median(values):.2f} ms/step "
              f"(repeats {', '.join(f'{v:.2f}' for v in values)})")
    print(f"hetbench / ddp: median {statistics.median(ratios):.3f} "
          f"(per repeat {', '.join(f'{r:.3f}' for r in ratios)}; target at most 1.02)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
