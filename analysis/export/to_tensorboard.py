"""A run's records as TensorBoard scalars, written with PyTorch's SummaryWriter.

One event folder per worker, `RUN_ID/rank0`, `RUN_ID/rank1`, ..., each with the same tags,
so that TensorBoard draws every worker as one line of the same chart (as Megatron logs its
per-rank timers); the held-out evaluations in `RUN_ID/heldout`. Per step (its number the
global step, its wall time the run's start plus the step's offset from the first step):

- `phase/compute_ms`, `phase/idle_ms` (before the exchange), `phase/comm_ms`,
  `phase/forward_ms`, `phase/backward_ms`, `phase/step_ms` (begin to end), as DESIGN.md
  defines them (hetbench.analysis.view.metrics.with_derived);
- `slice/samples`: the worker's slice of the batch;
- `staleness/updates`, where the aggregator records it (parameter servers, ssp, local SGD);
- `train/loss`: the worker's own loss on its slice;
- `heldout/<metric>` at each evaluation: loss and the workload's metric.
"""

from __future__ import annotations

import sys
import types
from datetime import datetime
from pathlib import Path
from typing import Any

from hetbench.analysis.view.metrics import complete_steps, with_derived
from hetbench.harness.records.results import Run

NS_PER_MS = 1e6
PHASES = {"phase/compute_ms": "compute_ns", "phase/idle_ms": "idle_ns",
          "phase/comm_ms": "comm_ns", "phase/forward_ms": "forward_ns",
          "phase/backward_ms": "backward_ns", "phase/step_ms": "busy_ns"}
# eval.parquet's columns that are not a measure of the model
EVAL_BOOKKEEPING = {"step", "samples", "wall_s", "train_s", "eval_s", "heldout_samples"}


def export(run: Run, out: Path) -> list[Path]:
    """Write the run's event files under out/RUN_ID (replacing those of an earlier export);
    returns the folders written."""
    manifest, steps, evals = run.manifest, run.steps, run.evals
    SummaryWriter = _summary_writer()
    run_dir = out / str(manifest.get("run_id", "run"))
    start_s = _start_seconds(manifest)
    d = with_derived(complete_steps(steps)) if len(steps) else steps
    first_ns = int(d["begin_ns"].min()) if len(d) else 0
    written = []
    for rank, rows in d.groupby("rank", sort=True):
        folder = run_dir / f"rank{int(rank)}"
        walltimes = start_s + (rows["begin_ns"].to_numpy() - first_ns) / 1e9
        series = {tag: rows[column].to_numpy() / NS_PER_MS for tag, column in PHASES.items()
                  if column in rows}
        series["slice/samples"] = rows["batch_size"].to_numpy()
        if "staleness" in rows and rows["staleness"].any():
            series["staleness/updates"] = rows["staleness"].to_numpy()
        if "local_loss" in rows:
            series["train/loss"] = rows["local_loss"].to_numpy()
        _clear(folder)
        with SummaryWriter(log_dir=str(folder)) as writer:
            for i, step in enumerate(rows["step"].to_numpy()):
                for tag, values in series.items():
                    writer.add_scalar(tag, float(values[i]), int(step), float(walltimes[i]))
        written.append(folder)
    if len(evals):
        folder = run_dir / "heldout"
        measures = [c for c in evals.columns if c not in EVAL_BOOKKEEPING]
        _clear(folder)
        with SummaryWriter(log_dir=str(folder)) as writer:
            for row in evals.itertuples(index=False):
                when = start_s + float(getattr(row, "wall_s", 0.0))
                for measure in measures:
                    writer.add_scalar(f"heldout/{measure}", float(getattr(row, measure)),
                                      int(row.step), when)
        written.append(folder)
    return written


def _clear(folder: Path) -> None:
    """An export again replaces the last: TensorBoard reads every event file of a folder."""
    for stale in folder.glob("events.out.tfevents.*"):
        stale.unlink()


def _summary_writer() -> Any:
    """PyTorch's SummaryWriter, on TensorBoard's own file layer: where TensorFlow is
    installed TensorBoard would load it for file access (seconds, and its log on stderr);
    the marker module below is how TensorBoard's TensorFlow-free build says not to."""
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter


def _start_seconds(manifest: dict[str, Any]) -> float:
    """The run's start as seconds since the epoch (its manifest's ISO time)."""
    start = manifest.get("start")
    return datetime.fromisoformat(start).timestamp() if start else 0.0
