"""A parameter server's clock as a worker sees it (issue 27).

A server stamps when a push arrived and when its wait ended on its own CLOCK_MONOTONIC
(perf_counter_ns); the worker splits its exchange into push, wait and pull with those
stamps. On the worker's host (and time namespace: `clocks.domain`) the clocks are one and
nothing is applied. A server on another host counts from another origin: the worker
measures the server's offset by RPC ping-pong before its first push, as
`hetbench.harness.system.clocks.measure` measures workers' (the shortest of ROUNDS round trips,
NTP's minimum filter; half of it is the uncertainty), and maps the server's stamps to its
own clock. The offset is taken once: a run's exchanges last seconds to minutes, over which
two hosts' clocks drift by microseconds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from hetbench.harness.system import clocks


@dataclass(frozen=True)
class ServerClock:
    """One server's clock minus this worker's, and the bound on the error."""

    server: str
    offset_ns: int = 0
    uncertainty_ns: int = 0
    applied: bool = False  # another clock domain: its stamps are mapped

    def local(self, server_ns: int) -> int:
        """An instant on the server's clock, on this worker's."""
        return server_ns - self.offset_ns

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stamp() -> tuple[int, int, str]:
    """On the server (an RPC): when the call arrived and when it is answered, on its
    clock, and the clock's domain."""
    received = time.perf_counter_ns()
    return received, time.perf_counter_ns(), clocks.domain()


def measure(server: str, rounds: int = clocks.ROUNDS) -> ServerClock:
    """`server`'s clock as this worker sees it: its offset where its clock domain is not
    this worker's, else nothing to apply (one round tells)."""
    import torch.distributed.rpc as rpc

    mine = clocks.domain()
    best_rtt, best_offset = None, 0
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        t1, t2, domain = rpc.rpc_sync(server, stamp)
        t3 = time.perf_counter_ns()
        if domain == mine:
            return ServerClock(server)
        rtt = (t3 - t0) - (t2 - t1)
        if best_rtt is None or rtt < best_rtt:
            best_rtt, best_offset = rtt, ((t1 - t0) + (t2 - t3)) // 2
    return ServerClock(server, best_offset, (best_rtt or 0) // 2, applied=True)
