"""Workers' clocks, and the alignment of their records to rank 0's clock.

Timestamps are perf_counter_ns: CLOCK_MONOTONIC, which each host (each time namespace)
counts from its own origin. A rank's offset (its clock minus rank 0's) is estimated by
ping-pong: rank 0 sends at t0, the rank answers with its receive and send times t1 and t2,
rank 0 receives at t3; offset = ((t1 - t0) + (t2 - t3)) / 2, off by at most half the
round trip (t3 - t0) - (t2 - t1). Of several rounds the one with the shortest round trip
is kept (NTP's minimum filter: queueing only ever lengthens a round trip), and half its
round trip is recorded as the uncertainty. Offsets are taken when training starts and
when it ends; between the two they are interpolated linearly in time (the clocks drift
apart at a steady rate over minutes).

Where every worker shares one clock (same host and time namespace: `domain`) nothing is
applied, and the estimates only show the method's error.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

ROUNDS = 16
# the record columns that are instants on the worker's clock (the rest are durations)
INSTANTS = ("begin_ns", "ready_ns", "reduced_ns", "end_ns")


@dataclass(frozen=True)
class Offsets:
    """One estimate: per rank, its clock minus rank 0's and the bound on the error."""

    at_ns: int  # rank 0's clock at the estimate
    offset_ns: list[int]
    uncertainty_ns: list[int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def domain() -> str:
    """Processes with the same domain read the same CLOCK_MONOTONIC: one host, one time
    namespace (Linux's time namespaces can shift it: `unshare --time --monotonic`)."""
    try:
        namespace = os.stat("/proc/self/ns/time").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}/{namespace}"


def measure(rounds: int = ROUNDS) -> Offsets:
    """Every rank's offset, known on every rank; collective (every rank calls it). Over
    gloo on host memory whatever the run's backend: a GPU's latency is not the clock's."""
    import torch
    import torch.distributed as dist

    group = _host_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    table = torch.zeros(2, world, dtype=torch.int64)  # offsets, uncertainties
    message = torch.zeros(2, dtype=torch.int64)
    now = time.perf_counter_ns
    at = now()
    for peer in range(1, world):
        best_rtt, best_offset = None, 0
        for _ in range(rounds):
            if rank == 0:
                t0 = now()
                dist.send(message, dst=peer, group=group)
                dist.recv(message, src=peer, group=group)
                t3 = now()
                t1, t2 = int(message[0]), int(message[1])
                rtt = (t3 - t0) - (t2 - t1)
                if best_rtt is None or rtt < best_rtt:
                    best_rtt, best_offset = rtt, ((t1 - t0) + (t2 - t3)) // 2
            elif rank == peer:
                dist.recv(message, src=0, group=group)
                message[0] = now()
                message[1] = now()
                dist.send(message, dst=0, group=group)
        if rank == 0:
            table[0, peer], table[1, peer] = best_offset, (best_rtt or 0) // 2
    dist.broadcast(table, src=0, group=group)
    stamp = torch.tensor([at], dtype=torch.int64)
    dist.broadcast(stamp, src=0, group=group)
    return Offsets(int(stamp[0]), table[0].tolist(), table[1].tolist())


_group: Any = None


def _host_group() -> Any:
    """The default group when it is gloo, else a gloo group of every rank (made once)."""
    global _group
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    if _group is None:
        _group = dist.new_group(backend="gloo")
    return _group


def align(frame: Any, start: dict[str, Any], end: dict[str, Any] | None = None) -> Any:
    """The records' instants moved onto rank 0's clock (in place; the frame is returned):
    each rank's offset interpolated between the start and end estimates (the start one
    alone when there is no end: a run that failed)."""
    if not len(frame):
        return frame
    ranks = frame["rank"].to_numpy()
    first = np.asarray(start["offset_ns"], dtype=np.int64)[ranks]
    if end is None or end["at_ns"] == start["at_ns"]:
        offsets = first.astype(np.float64)
    else:
        last = np.asarray(end["offset_ns"], dtype=np.int64)[ranks]
        # the row's first instant (a bucket's has no begin), ~ rank 0's time of the row
        local = frame["begin_ns" if "begin_ns" in frame else "ready_ns"].to_numpy() - first
        share = (local - start["at_ns"]) / (end["at_ns"] - start["at_ns"])
        offsets = first + share * (last - first)
    for column in INSTANTS:
        if column in frame:  # micro-batch (begin, end) and bucket (ready, reduced) rows
            frame[column] = frame[column] - np.rint(offsets).astype(np.int64)
    return frame
