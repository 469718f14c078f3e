"""Step records built by hand, with known answers, for framework-free analysis tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetbench.harness.records import collector, manifest, trace
from hetbench.harness.records.collector import RECORD_DTYPE

MS = 1_000_000
COUNTED_LATER = ("compute_wait_ns", "compute_slices", "compute_faults", "compute_major_faults",
                 "compute_switches", "compute_migrations", "compute_instructions",
                 "compute_cycles", "compute_cache_misses")


def steps_frame(n_steps: int, compute_ms: Callable[[int, int], float], world: int = 2,
                batch: Callable[[int], int] = lambda r: 32, comm_ms: float = 0.5,
                edit: Callable[[np.ndarray], None] | None = None) -> pd.DataFrame:
    """Records where worker r's step s computes compute_ms(r, s) (split 40/60 over forward
    and backward, main thread on CPU the whole time), all begin together, communication
    takes comm_ms after the last arrival and the update 0.1 ms."""
    rows = np.zeros(n_steps * world, dtype=RECORD_DTYPE)
    period = 0
    i = 0
    for s in range(n_steps):
        computes = [int(compute_ms(r, s) * MS) for r in range(world)]
        arrival = period + max(computes)
        for r in range(world):
            row = rows[i]
            row["rank"], row["step"], row["batch_size"] = r, s, batch(r)
            row["begin_ns"], row["ready_ns"] = period, period + computes[r]
            row["reduced_ns"] = arrival + int(comm_ms * MS)
            row["end_ns"] = row["reduced_ns"] + MS // 10
            row["forward_ns"] = computes[r] * 4 // 10
            row["backward_ns"] = computes[r] - row["forward_ns"]
            row["allreduce_ns"] = row["reduced_ns"] - row["ready_ns"]
            row["apply_ns"] = MS // 10
            row["compute_cpu_ns"] = computes[r]
            # the kernel's counts as a run recorded before them (tests set them to use them)
            for unmeasured in COUNTED_LATER:
                row[unmeasured] = -1
            row["ctx_voluntary"] = 3
            row["rss_bytes"] = 100 * MS
            row["loss"] = row["local_loss"] = 1.0
            i += 1
        period = int(rows[i - 1]["end_ns"]) + MS // 100
    if edit is not None:
        edit(rows)
    return collector.records_frame([rows])


def write_run(folder: Path, steps: pd.DataFrame, name: str = "r", repeat: int = 0,
              status: str = "completed", planned_steps: int | None = None,
              slowdown: tuple[float, ...] = (1.0, 1.0), standalone: list[dict] | None = None,
              strategy: str = "torch") -> Path:
    """A run directory as hetbench writes it (manifest + steps.parquet + trace.json)."""
    run_dir = folder / f"{name}-r{repeat}"
    run_dir.mkdir(parents=True)
    run: dict[str, Any] = {
        "name": name, "framework": "pytorch", "workload": "mlp", "dataset": "digits",
        "steps": planned_steps or int(steps["step"].nunique()), "warmup_steps": 0,
        "global_batch": 64, "partition": {"policy": "sizes"}, "strategy": strategy,
        "workers": [{"device": "cpu", "threads": 1, "slowdown": f} for f in slowdown],
    }
    heterogeneity = "emulated" if any(f != 1.0 for f in slowdown) else "homogeneous"
    meta = manifest.new({"name": "synthetic"}, run, repeat, run_dir.name, {"host": "test"},
                        heterogeneity)
    meta.update(status=status, standalone=standalone or [])
    manifest.write(run_dir, meta)
    collector.write_steps(run_dir, steps)
    trace.write_trace(run_dir, steps, [f"worker {r}" for r in range(len(slowdown))])
    return run_dir
