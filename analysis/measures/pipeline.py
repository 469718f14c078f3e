"""Pipelined virtual workers (HetPipe, issue 14): per stage, the measured time per
micro-batch against the partitioner's prediction, and the pipeline bubble; per wave, the
micro-batch timeline of one virtual worker (figures.pipeline_figure draws it).

Inputs: the run's manifest (its `pipeline`: split, predicted stage times), steps.parquet
(per stage and wave: forward and backward are the stage's busy time, pack the rest of the
schedule: waiting for activations or gradients and sending them) and microbatches.parquet
(each micro-batch's forward and backward on each stage).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from hetbench.harness.records.results import Run

STAGE_COLUMNS = ["virtual_worker", "stage", "rank", "layers", "predicted_ms", "measured_ms",
                 "error", "forward_ms", "backward_ms", "bubble_fraction", "ideal_bubble"]


def is_pipelined(manifest: dict[str, Any]) -> bool:
    return bool((manifest.get("run") or {}).get("pipeline")) and "pipeline" in manifest


def stage_table(run: Run) -> pd.DataFrame:
    """One row per stage of every virtual worker: its layers, the predicted and measured
    time of one micro-batch's forward + backward (median over waves after warm-up; error =
    measured / predicted - 1), and the bubble fraction: the share of the schedule's span
    the stage spent neither computing forward nor backward (mean over waves). ideal_bubble:
    GPipe's (S - 1) / (Nm + S - 1) for S equal stages and Nm micro-batches."""
    manifest, steps, micro = run.manifest, run.steps, run.micro
    if not is_pipelined(manifest) or steps.empty or micro.empty:
        return pd.DataFrame(columns=STAGE_COLUMNS)
    plan = manifest["pipeline"]
    warmup = run.warmup_steps
    micro = micro[micro["wave"] >= warmup]
    steps = steps[steps["step"] >= warmup]
    n_micro = int(plan["micro_batches"])
    duration = micro.assign(ns=micro["end_ns"] - micro["begin_ns"])
    per_wave = duration.groupby(["rank", "wave", "backward"])["ns"].sum().unstack("backward")
    span = steps["forward_ns"] + steps["backward_ns"] + steps["pack_ns"]
    bubble = (steps["pack_ns"] / span.where(span > 0)).groupby(steps["rank"]).mean()
    rows = []
    for v, ranks in enumerate(plan["virtual_workers"]):
        bounds = plan["bounds"][v]
        for s, rank in enumerate(ranks):
            if rank not in per_wave.index.get_level_values(0):
                continue
            waves = per_wave.loc[rank]
            forward = waves.get(False, pd.Series(dtype=float)).median() / n_micro
            backward = waves.get(True, pd.Series(dtype=float)).median() / n_micro
            measured = (waves.get(False, 0) + waves.get(True, 0)).median() / n_micro
            predicted = float(plan["predicted_stage_ns"][v][s])
            rows.append({"virtual_worker": v, "stage": s, "rank": rank,
                         "layers": f"{bounds[s]}-{bounds[s + 1] - 1}",
                         "predicted_ms": predicted / 1e6, "measured_ms": measured / 1e6,
                         "error": measured / predicted - 1.0 if predicted > 0 else np.nan,
                         "forward_ms": forward / 1e6, "backward_ms": backward / 1e6,
                         "bubble_fraction": float(bubble.get(rank, np.nan)),
                         "ideal_bubble": (len(ranks) - 1) / (n_micro + len(ranks) - 1)})
    return pd.DataFrame(rows, columns=STAGE_COLUMNS)


def pipeline_table(runs: Sequence[Run]) -> pd.DataFrame:
    """stage_table of every pipelined run, with its run id, schedule and micro-batches."""
    parts = []
    for run in runs:
        manifest = run.manifest
        table = stage_table(run)
        if len(table):
            plan = manifest["pipeline"]
            parts.append(table.assign(run=manifest["run"].get("name", ""),
                                      repeat=int(manifest.get("repeat", 0)),
                                      allocation=plan.get("allocation", "given"),
                                      schedule=plan["schedule"],
                                      micro_batches=int(plan["micro_batches"]),
                                      wave_bound=int(plan["wave_bound"])))
    if not parts:
        return pd.DataFrame()
    frame = pd.concat(parts, ignore_index=True)
    return frame[["run", "repeat", "allocation", "schedule", "micro_batches", "wave_bound",
                  *STAGE_COLUMNS]]


def pipeline_summary(table: pd.DataFrame) -> pd.DataFrame:
    """pipeline_table averaged over repeats: one row per run name and stage, the split
    that was most often chosen shown with it."""
    if table.empty:
        return table
    keys = ["run", "allocation", "schedule", "micro_batches", "wave_bound", "virtual_worker",
            "stage", "rank"]
    numbers = ["predicted_ms", "measured_ms", "error", "forward_ms", "backward_ms",
               "bubble_fraction", "ideal_bubble"]
    grouped = table.groupby(keys, sort=False)
    out = grouped[numbers].mean()
    out.insert(0, "layers", grouped["layers"].agg(lambda v: v.mode().iloc[0]))
    out.insert(0, "repeats", grouped.size())
    return out.reset_index()


def typical_wave(run: Run) -> int | None:
    """The wave after warm-up whose span (first begin to last end) is the median's."""
    steps = run.steps[run.steps["step"] >= run.warmup_steps]
    if steps.empty:
        return None
    span = steps.groupby("step").agg(b=("begin_ns", "min"), e=("end_ns", "max"))
    length = span["e"] - span["b"]
    return int((length - length.median()).abs().idxmin())


def timeline(manifest: dict[str, Any], micro: pd.DataFrame, wave: int,
             virtual_worker: int = 0) -> pd.DataFrame:
    """The micro-batches of one wave on the stages of one virtual worker: stage, rank,
    micro_batch, backward, start_ms (from the wave's first begin) and duration_ms."""
    ranks = manifest["pipeline"]["virtual_workers"][virtual_worker]
    rows = micro[(micro["wave"] == wave) & micro["rank"].isin(ranks)]
    if rows.empty:
        return pd.DataFrame(columns=["stage", "rank", "micro_batch", "backward", "start_ms",
                                     "duration_ms"])
    origin = rows["begin_ns"].min()
    return pd.DataFrame({
        "stage": rows["rank"].map({r: s for s, r in enumerate(ranks)}).to_numpy(),
        "rank": rows["rank"].to_numpy(), "micro_batch": rows["micro_batch"].to_numpy(),
        "backward": rows["backward"].to_numpy(),
        "start_ms": (rows["begin_ns"] - origin).to_numpy() / 1e6,
        "duration_ms": (rows["end_ns"] - rows["begin_ns"]).to_numpy() / 1e6})
