"""What every trainer in the worker processes (the data-parallel worker, pipeline
stages) does before its first step and after its last: each rank describes itself and
measures its clock against rank 0's (`start`); at the end its description and records go to
rank 0, which writes the completed run directory (`finish`, records.rundir.complete)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from hetbench.harness.loop import counters
from hetbench.harness.records import collector, rundir
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.spec.workers import WorkerSpec
from hetbench.harness.system import clocks


def describe(run: RunSpec, rank: int, worker: WorkerSpec, versions: dict[str, str],
             data: Any, parameters: int, **more: Any) -> dict[str, Any]:
    """What the manifest says of this worker: where it ran, what it was, what it read."""
    return {"rank": rank, "host": socket.gethostname(), "clock_domain": clocks.domain(),
            "pid": os.getpid(), "label": worker.label, **run.to_dict()["workers"][rank],
            "emulated": worker.emulated, "affinity": sorted(os.sched_getaffinity(0)),
            "versions": versions, "dataset_source": data.source,
            "dataset_fingerprint": data.fingerprint, "parameters": parameters,
            "counters": counters.describe(), **more}


def start(run_dir: Path, info: dict[str, Any], device: Any) -> dict[str, Any]:
    """Before the first step, every rank: its description is left in parts/ (for whoever
    closes a run that fails), its clock offset to rank 0 is measured, and rank 0 writes
    every rank's clock domain. Returns the offsets at the start."""
    from hetbench.harness.exchange import comm

    (run_dir / collector.PARTS_DIR / f"rank{info['rank']}.json").write_text(json.dumps(info))
    clock_start = clocks.measure().to_dict()
    domains = comm.gather_bytes(info["clock_domain"].encode(), device)
    if domains is not None:  # rank 0
        collector.write_clock(run_dir, clock_start, [d.decode() for d in domains])
    return clock_start


def finish(run: RunSpec, run_dir: Path, device: Any, info: dict[str, Any],
           clock_start: dict[str, Any], records: Any, parameters: dict[str, Any] | None,
           backend: str, closing: dict[str, Any],
           side: dict[collector.SideTable, Any] | None = None) -> None:
    """After training, every rank: what each worker was and recorded goes to rank 0 (JSON
    and the records' fixed dtype), which writes steps.parquet, the trace, params.npz (its
    `parameters`, the whole model's) and the completed manifest with `closing` in it.
    `side`: the trainer's side-table records (a pipeline stage's micro-batches, a DDP
    worker's buckets), gathered the same way; every rank names the same tables."""
    import numpy as np

    from hetbench.harness.exchange import comm

    clock_end = clocks.measure().to_dict()
    gathered_infos = comm.gather_bytes(json.dumps(info).encode(), device)
    gathered_records = comm.gather_bytes(records.tobytes(), device)
    gathered_side = {table: comm.gather_bytes(rows.tobytes(), device)
                     for table, rows in (side or {}).items()}
    if gathered_infos is None or gathered_records is None:
        return
    infos = [json.loads(g) for g in gathered_infos]
    arrays = [np.frombuffer(g, dtype=collector.RECORD_DTYPE) for g in gathered_records]
    side_arrays = {table.file: [np.frombuffer(g, dtype=table.dtype) for g in gathered or ()]
                   for table, gathered in gathered_side.items()}
    rundir.complete(run_dir, arrays, infos, parameters,
                    {"start": clock_start, "end": clock_end}, backend, closing, side_arrays)
    collector.remove_temporary(run_dir)  # the reserve (torchrun mode has no launcher)
