"""How long does the simulator take as workers and steps grow? One core (numpy's threads
pinned to one), a job of two shipped profiles (half cpu-3x, half cpu-6x of the MLP on
digits), each scheme at N workers x S steps, simulation and summary only (no records).
Target (issue 29): 1,024 workers x 10,000 steps of every scheme in 10 s.

    python benchmarks/simulate_scale.py                 # the grid below, ~1 minute
    python benchmarks/simulate_scale.py --workers 1024 --steps 10000 --scheme bsp
"""

from __future__ import annotations

import os

for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = "1"  # before numpy loads its BLAS

import argparse  # noqa: E402
import time  # noqa: E402

import pandas as pd  # noqa: E402

from hetbench.analysis.models import deviceclass, simulate  # noqa: E402

PROFILES = ("cpu-3x@mlp-digits", "cpu-6x@mlp-digits")
SCHEMES = ("bsp", "bsp-adaptive", "ps-sync", "backup:8", "ssp:2", "ps-async", "local-sgd:4")


def job(workers: int) -> tuple[list[deviceclass.DeviceClass], deviceclass.CommModel]:
    profiles = deviceclass.named_profiles()
    half = workers // 2
    mix = [(PROFILES[0], workers - half), (PROFILES[1], half)] if half else [(PROFILES[0], 1)]
    found, comm = deviceclass.resolve_mix(mix, {}, {}, profiles)
    assert comm is not None
    return found, comm


def timed(scheme: str, workers: int, steps: int) -> dict[str, float]:
    classes, comm = job(workers)
    started = time.perf_counter()
    sim = simulate.simulate(classes, comm, simulate.parse_scheme(scheme), steps, 32 * workers)
    simulated = time.perf_counter() - started
    summary = simulate.summarise(sim)
    return {"scheme": scheme, "workers": workers, "steps": steps, "seconds": simulated,
            "with_summary_s": time.perf_counter() - started,
            "mean_step_ms": summary["mean_step_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="*", default=[64, 256, 1024, 4096])
    parser.add_argument("--steps", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--scheme", nargs="*", default=list(SCHEMES))
    args = parser.parse_args()
    rows = []
    for scheme in args.scheme:
        for steps in args.steps:
            for workers in args.workers:
                if workers * steps > 12_000_000:  # 4096 x 10,000: ~6 GB of arrays
                    continue
                rows.append(timed(scheme, workers, steps))
                print(f"{scheme:12s} {workers:5d} workers x {steps:6d} steps: "
                      f"{rows[-1]['seconds']:.2f} s (+ summary {rows[-1]['with_summary_s']:.2f} s)",
                      flush=True)
    table = pd.DataFrame(rows)
    print("\nseconds (simulation and summary), by workers:")
    print(table.pivot_table(index=["scheme", "steps"], columns="workers",
                            values="with_summary_s").to_string(float_format=lambda v: f"{v:.2f}"))


if __name__ == "__main__":
    main()
