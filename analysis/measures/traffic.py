"""Bytes on the wire under a parameter server's layer placement (issue 14, after arXiv
1901.05803): per worker and per server, per step, from what each worker counted.

Each worker of a parameter-server run records in the manifest (`workers[r].traffic`) the
bytes of tensors it sent to and received from each server over its steps: gradient sums
pushed and parameters pulled, and under `fc-on-server` the activations and labels sent to
the server that computes the fully connected layers and the activation gradients it
answers with (the tail's parameters fetched for evaluations and at the end are counted
apart, as `read`). A server's traffic is the sum over the workers of what they sent it and
got from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from hetbench.analysis.view.metrics import run_summary
from hetbench.harness.records.results import Run

Runs = Sequence[Run]
TRAFFIC_COLUMNS = ["run", "repeat", "placement", "servers", "worker_mb_per_step",
                   "busiest_worker_mb_per_step", "server_mb_per_step",
                   "busiest_server_mb_per_step", "mean_step_ms", "samples_per_s"]


def placement_of(manifest: dict[str, Any]) -> str | None:
    return (manifest.get("run") or {}).get("placement")


def per_endpoint(manifest: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(workers, servers): MB per step each sent and received, and their sum."""
    workers: list[dict[str, Any]] = []
    servers: dict[str, dict[str, Any]] = {}
    for rank, info in enumerate(manifest.get("workers") or []):
        traffic = (info or {}).get("traffic")
        if not traffic or not traffic.get("steps"):
            continue
        steps = traffic["steps"]
        sent = sum(traffic["sent"].values()) / steps / 1e6
        received = sum(traffic["received"].values()) / steps / 1e6
        workers.append({"rank": rank, "sent_mb": sent, "received_mb": received,
                        "total_mb": sent + received})
        for server, value in traffic["sent"].items():
            row = servers.setdefault(server, {"server": server, "received_mb": 0.0,
                                              "sent_mb": 0.0})
            row["received_mb"] += value / steps / 1e6
        for server, value in traffic["received"].items():
            row = servers.setdefault(server, {"server": server, "received_mb": 0.0,
                                              "sent_mb": 0.0})
            row["sent_mb"] += value / steps / 1e6
    worker_frame = pd.DataFrame(workers, columns=["rank", "sent_mb", "received_mb", "total_mb"])
    server_frame = pd.DataFrame(list(servers.values()),
                                columns=["server", "received_mb", "sent_mb"])
    server_frame["total_mb"] = server_frame["received_mb"] + server_frame["sent_mb"]
    return worker_frame, server_frame.sort_values("server").reset_index(drop=True)


def traffic_table(runs: Runs) -> pd.DataFrame:
    """One row per run that placed layers on parameter servers: MB on the wire per step,
    per worker (mean and busiest) and per server (mean and busiest), with the run's mean
    step time and samples/s after warm-up."""
    rows = []
    for run in runs:
        placement = placement_of(run.manifest)
        if placement is None:
            continue
        workers, servers = per_endpoint(run.manifest)
        if workers.empty:
            continue
        summary = run_summary(run.steps, run.warmup_steps)
        rows.append({"run": run.name, "repeat": run.repeat,
                     "placement": placement, "servers": len(servers),
                     "worker_mb_per_step": float(workers["total_mb"].mean()),
                     "busiest_worker_mb_per_step": float(workers["total_mb"].max()),
                     "server_mb_per_step": float(servers["total_mb"].mean()),
                     "busiest_server_mb_per_step": float(servers["total_mb"].max()),
                     "mean_step_ms": summary["mean_step_ms"],
                     "samples_per_s": summary["samples_per_s"]})
    return pd.DataFrame(rows, columns=TRAFFIC_COLUMNS)


def traffic_summary(table: pd.DataFrame) -> pd.DataFrame:
    """traffic_table averaged over repeats, one row per run name."""
    if table.empty:
        return table
    numbers = [c for c in TRAFFIC_COLUMNS if c not in ("run", "repeat", "placement")]
    grouped = table.groupby(["run", "placement"], sort=False)
    out = grouped[numbers].mean()
    out.insert(0, "repeats", grouped.size())
    return out.reset_index()
