"""The end of a run, shared by every loop that trains in the worker processes (the
data-parallel worker and pipeline stages): each rank's description and records go to rank 0,
which writes the completed run directory (records.rundir.complete)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.records import collector, rundir
from harness.spec.suite import RunSpec
from harness.system import clocks


def finish(run: RunSpec, run_dir: Path, device: Any, info: dict[str, Any],
           clock_start: dict[str, Any], records: Any, parameters: dict[str, Any] | None,
           backend: str, closing: dict[str, Any], micro: Any = None) -> None:
    """After training, every rank: what each worker was and recorded goes to rank 0 (JSON
    and the records' fixed dtype), which writes steps.parquet, the trace, params.npz (its
    `parameters`, the whole model's) and the completed manifest with `closing` in it.
    `micro`: a pipeline stage's micro-batch records, gathered the same way."""
    import numpy as np

    from harness.exchange import comm

    clock_end = clocks.measure().to_dict()
    gathered_infos = comm.gather_bytes(json.dumps(info).encode(), device)
    gathered_records = comm.gather_bytes(records.tobytes(), device)
    gathered_micro = (None if micro is None
                      else comm.gather_bytes(micro.tobytes(), device))
    if gathered_infos is None or gathered_records is None:
        return
    infos = [json.loads(g) for g in gathered_infos]
    arrays = [np.frombuffer(g, dtype=collector.RECORD_DTYPE) for g in gathered_records]
    micro_arrays = (None if gathered_micro is None else
                    [np.frombuffer(g, dtype=collector.MICRO_DTYPE) for g in gathered_micro])
    rundir.complete(run_dir, arrays, infos, parameters,
                    {"start": clock_start, "end": clock_end}, backend, closing, micro_arrays)
    collector.remove_temporary(run_dir)  # the reserve (torchrun mode has no launcher)
