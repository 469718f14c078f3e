"""Parameter servers: ps-sync, backup, ps-async and ssp, over torch.distributed.rpc.

hetbench starts S server processes (start_servers, from the launcher: on 127.0.0.1, or
across hosts each on the node `server_nodes` names) and stops them after the workers. The
flat parameter vector is cut into S contiguous shards on parameter boundaries, balanced by
element count (`shards.balanced_cuts`, recorded in the manifest); each server holds its
shard and runs the run's optimizer on it (harness/training/optim.py, the code the
all-reduce path runs on the workers), so updates are the same mathematics. A worker
pushes each shard of its gradient sums (the loss sum rides with the last shard) to its
server and gets the shard's parameters back in the reply: one RPC per shard per step, all
shards in flight together.

Schemes (the server's `version` counts the updates it applied):
- ps-sync: a server waits for every worker's push of version v, applies one update with
  their sum over the global batch and answers them all: the all-reduce step, exactly.
- backup: the same over the first n - b pushes of version v, divided by the samples they
  carry; a push computed on an older version is dropped (recorded), answered at once with
  the current parameters, and its worker goes on from there. One server only: which
  pushes count must be decided in one place.
- ps-async: every push is applied when it arrives, as its share of a global step (its
  gradient sum over the global batch), and answered at once. The run ends when the
  servers have applied the samples of `steps` global batches, so fast workers take more
  steps than slow ones.
- ssp: the same, but a worker that pushed its clock c (its c-th push, from 0) is answered
  only when every worker has pushed clock c - s: s = 0 is BSP (with plain SGD the same
  parameters), a larger s lets fast workers run up to s steps ahead.
- wsp: ssp among virtual workers (harness/exchange/waves.py): one server per pipeline stage, a
  push per stage and wave, s the wave bound D.
The staleness of an update is the server's version when it is applied minus the version
its gradient was computed on; under ps-async and ssp versions count single pushes, so even
a lockstep round of n workers has staleness 0 to n - 1. `staleness_lr = "dynsgd"` scales
an asynchronous update by 1 / (1 + staleness), as DynSGD does.

Timing: the server stamps when a push arrived and when its wait ended (perf_counter_ns,
CLOCK_MONOTONIC: the clock every process of the host shares), so the worker splits its
exchange into push (to the server), wait (for other workers or the bound) and pull (the
update and the way back). Across hosts (`server_nodes`: each server started by its host's
launcher) a server's stamps are mapped to the worker's clock with its measured offset
(harness/exchange/server_clocks.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from hetbench.harness.exchange import (
    Context,
    Exchange,
    Holds,
    next_step,
    placement,
    rendezvous,
    server_clocks,
)
from hetbench.harness.partition import shards
from hetbench.harness.spec.suite import RunSpec, run_from_dict
from hetbench.harness.system import orphans
from hetbench.harness.system.exits import exit_after
from hetbench.harness.system.services import Services

if TYPE_CHECKING:
    from hetbench.adapters.base import TorchLayersAdapter

INIT_ENV = "HETBENCH_PS_INIT"  # tcp://127.0.0.1:port, the RPC rendezvous


def start_servers(run: RunSpec, free_port: Callable[[], int], logs: Path, run_dir: Path,
                  services: Services) -> None:
    """This host's servers (`server_nodes`), in the run's private namespace on one host
    (Services.make_private): RPC runs pickled calls, which nobody outside the run may send.
    Across hosts they bind this host's interface, and the RPC rendezvous (on worker 0)
    listens on the master's address alone."""
    env = {INIT_ENV: f"tcp://{services.address}:{free_port()}", **services.binding}
    services.env.update(env)
    server_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1",
                  "HETBENCH_LAUNCHER_PID": str(os.getpid())}
    for index in range(run.aggregator.servers):
        if run.aggregator.server_node(index) == services.node:
            services.start(f"ps{index}", [sys.executable, "-m", __name__, "--run-dir",
                                          str(run_dir), "--index", str(index)], server_env,
                           logs)


def rpc_options(timeout_s: float) -> rpc.TensorPipeRpcBackendOptions:
    # TCP (libuv) only: TensorPipe's shared-memory transport polls in a busy loop, and a
    # spinning thread per process takes the cores the workers compute on. Loopback only on
    # one host (issue 18): the rendezvous store (on worker 0) listens on its address alone
    # (rendezvous.bound_url), TensorPipe's listeners on TP_SOCKET_IFNAME's address (lo;
    # across hosts the host's interface towards node 0).
    init_method = rendezvous.bound_url(os.environ[INIT_ENV])
    return rpc.TensorPipeRpcBackendOptions(init_method=init_method, rpc_timeout=timeout_s,
                                           num_worker_threads=8, _transports=["uv"],
                                           _channels=["basic"])


# -- the server ----------------------------------------------------------------------------


@dataclass
class Reply:
    """What a push gets back beside the shard's parameters."""

    version: int  # the version the parameters are
    staleness: int
    received_ns: int
    released_ns: int
    samples: int  # the samples the returned loss sum covers
    dropped: bool
    done: bool
    progress: int  # global batches applied so far


class ShardServer:
    def __init__(self, run: RunSpec, values: torch.Tensor, has_loss: bool) -> None:
        from hetbench.harness.training.optim import Optimizer

        spec = run.aggregator
        # under wsp the pushers are virtual workers (each stage's server hears one stage
        # of each), and `rank` in a push is the virtual worker's index
        pushers = len(run.pipeline.virtual_workers) if run.pipeline else run.world_size
        self.workers, self.global_batch, self.steps = pushers, run.global_batch, run.steps
        self.synchronous = spec.name in ("ps-sync", "backup")
        self.needed = self.workers - (spec.backup if spec.name == "backup" else 0)
        self.bound = spec.staleness if spec.name in ("ssp", "wsp") else None
        self.dynsgd = spec.staleness_lr == "dynsgd"
        self.params = values.to(torch.float32).clone()
        self.count = len(self.params)
        self.has_loss = has_loss
        self.optimizer = Optimizer(run.optimizer, run.lr, run.steps, run.global_batch,
                                   self.count, self.params, torch.device("cpu"))
        self.lock = threading.Lock()
        self.version = 0
        self.applied = 0  # samples in applied updates
        self.done = False
        self.sums = torch.zeros(self.count + has_loss)
        self.sum_samples = 0
        self.pending: list[tuple[torch.futures.Future[Any], int]] = []  # sync: (future, received)
        self.clocks = [0] * self.workers  # async: pushes each worker made
        # async waiters: (future, clock it needs everyone at, received, staleness, loss, samples)
        self.waiting: list[tuple[torch.futures.Future[Any], int, int, int, float, int]] = []

    def _answer(self, future: torch.futures.Future[Any], reply: Reply, loss: float) -> None:
        values = self.params.clone()
        if self.has_loss:
            values = torch.cat([values, torch.tensor([loss])])
        future.set_result((values, reply))

    def push(self, version: int, clock: int, rank: int, grads: torch.Tensor, samples: int
             ) -> torch.futures.Future[Any]:
        received = time.perf_counter_ns()
        future: torch.futures.Future[Any] = torch.futures.Future()
        with self.lock:
            loss = float(grads[-1]) if self.has_loss else 0.0
            if self.done or (self.synchronous and version < self.version):
                # too late for its version (backup) or after the budget: not used
                self._answer(future, Reply(self.version, self.version - version, received,
                                           received, samples, True, self.done,
                                           self._progress()), loss)
                return future
            if self.synchronous:
                self._push_sync(future, received, grads, samples)
            else:
                self._push_async(future, received, version, clock, rank, grads, samples, loss)
        return future

    def _progress(self) -> int:
        return self.version if self.synchronous else self.applied // self.global_batch

    def _push_sync(self, future: torch.futures.Future[Any], received: int,
                   grads: torch.Tensor, samples: int) -> None:
        self.sums.add_(grads)
        self.sum_samples += samples
        self.pending.append((future, received))
        if len(self.pending) < self.needed:
            return
        released = time.perf_counter_ns()
        direction = self.sums[: self.count]
        scale = self.optimizer.update(self.version, direction, self.sum_samples)
        self.params.add_(direction, alpha=-scale)
        self.version += 1
        self.done = self.version >= self.steps
        loss = float(self.sums[-1]) if self.has_loss else 0.0
        for waiting, arrived in self.pending:
            self._answer(waiting, Reply(self.version, 0, arrived, released, self.sum_samples,
                                        False, self.done, self.version), loss)
        self.sums.zero_()
        self.sum_samples = 0
        self.pending = []

    def _push_async(self, future: torch.futures.Future[Any], received: int, version: int,
                    clock: int, rank: int, grads: torch.Tensor, samples: int,
                    loss: float) -> None:
        staleness = self.version - version
        direction = grads[: self.count]
        if self.dynsgd and staleness:
            direction.mul_(1.0 / (1 + staleness))
        # each push is its share of a global step: its sum over the global batch
        scale = self.optimizer.update(self._progress(), direction, self.global_batch)
        self.params.add_(direction, alpha=-scale)
        self.version += 1
        self.applied += samples
        self.done = self.applied >= self.steps * self.global_batch
        self.clocks[rank] = clock + 1
        needs = clock + 1 - self.bound if self.bound is not None else 0
        self.waiting.append((future, needs, received, staleness, loss, samples))
        self._release()

    def _release(self) -> None:
        slowest = min(self.clocks)
        still = []
        for future, needs, received, staleness, loss, samples in self.waiting:
            if slowest >= needs or self.done:
                self._answer(future, Reply(self.version, staleness, received,
                                           time.perf_counter_ns(), samples, False, self.done,
                                           self._progress()), loss)
            else:
                still.append((future, needs, received, staleness, loss, samples))
        self.waiting = still


_server: ShardServer | None = None
_run: Any = None


def init_shard(values: torch.Tensor, has_loss: bool) -> int:
    """Called once by worker 0 before any push: the shard's initial parameters."""
    global _server
    _server = ShardServer(_run, values, has_loss)
    return len(values)


def pull() -> tuple[torch.Tensor, int]:
    """The shard's parameters now and the global steps applied (an evaluation between
    pushes: wsp's worker 0 reads the whole model from its servers)."""
    assert _server is not None, "pull before init_shard"
    with _server.lock:
        return _server.params.clone(), _server._progress()


@rpc.functions.async_execution
def push(version: int, clock: int, rank: int, grads: torch.Tensor, samples: int
         ) -> torch.futures.Future[Any]:
    assert _server is not None, "push before init_shard"
    return _server.push(version, clock, rank, grads, samples)


def serve(run_dir: Path, index: int) -> int:
    """One server process: join the RPC group, answer until every worker has left."""
    global _run
    from hetbench.harness.records import rundir

    _run = run_from_dict(json.loads((run_dir / rundir.RUN_FILE).read_text())["run"])
    placement.serving(_run)
    n = _run.world_size
    orphans.follow_launcher()  # a server outlives no killed `hetbench run`
    (run_dir / "parts" / f"ps{index}.json").write_text(json.dumps(
        {"server": f"ps{index}", "pid": os.getpid(), "host": socket.gethostname()}))
    torch.set_num_threads(1)
    rpc.init_rpc(f"ps{index}", rank=n + index, world_size=n + _run.aggregator.servers,
                 rpc_backend_options=rpc_options(_run.timeout_s))
    # The workers' shutdown is the end of the run; the launcher stops a server whose
    # workers never come (it watches the workers and stops every service after them).
    rpc.shutdown(graceful=True)
    return 0


# -- the worker's side ----------------------------------------------------------------------


class ParameterServerClient:
    def __init__(self, context: Context) -> None:
        run = context.run
        spec = run.aggregator
        self.name, self.rank, self.steps = spec.name, context.rank, run.steps
        self.buffer, self.timeout_s, self.run = context.buffer, run.timeout_s, run
        # a dead peer never joins a graceful shutdown: leave alone once the run goes on
        # without dead workers (every reply of ours has come)
        self.graceful = run.on_worker_failure != "continue"
        self.lockstep = spec.name == "ps-sync"

        params = context.adapter.spec.params
        sizes = [p.size for p in params]
        n = sum(sizes)
        self.servers = [f"ps{k}" for k in range(spec.servers)]
        # fc-on-server runs only on frameworks with torch layers (spec.aggregators)
        self.tail = (TailClient(run, cast("TorchLayersAdapter", context.adapter),
                                self.servers[-1])
                     if run.placement == "fc-on-server" else None)
        self.segments = shards.segments(run.placement or "sharded", sizes, spec.servers,
                                 self.tail.first_tensor if self.tail else None)
        starts = shards.offsets(sizes)
        self.placement = [{"server": server, "parameters": [
            p.name for p, at in zip(params, starts, strict=False)
            if any(lo <= at < hi for lo, hi in pieces)],
            "elements": sum(min(hi, n) - lo for lo, hi in pieces if lo < n)}
            for server, pieces in zip(self.servers, self.segments, strict=True)]
        if self.tail is not None:
            self.placement[-1]["computes"] = self.tail.names
            self.placement[-1]["computed_elements"] = self.tail.hi - self.tail.lo
        # bytes of tensors sent to and received from each server (issue 14's traffic)
        self.sent = dict.fromkeys(self.servers, 0)
        self.received = dict.fromkeys(self.servers, 0)
        self.steps_taken = 0
        rpc.init_rpc(f"worker{self.rank}", rank=self.rank,
                     world_size=run.world_size + spec.servers,
                     rpc_backend_options=rpc_options(run.timeout_s))
        if self.rank == 0:
            initial = context.initial
            for server, pieces in zip(self.servers, self.segments, strict=True):
                if pieces:
                    held = [(lo, hi) for lo, hi in pieces if lo < n]
                    rpc.rpc_sync(server, init_shard, args=(
                        placement.gather(initial, held).clone(),
                        any(lo >= n for lo, _ in pieces)))
            if self.tail is not None:
                self.tail.start(initial)
        if self.tail is not None:
            # fc-on-server runs only on frameworks with torch layers (spec.aggregators)
            cast("TorchLayersAdapter", context.adapter).place_tail(self.tail.first_layer,
                                                                  self.tail.compute)
        dist.barrier()  # no worker pushes before every shard has its parameters
        # the servers' stamps on this worker's clock (a server on another host)
        self.clocks = {server: server_clocks.measure(server) for server in self.servers}
        self.version = 0
        self.clock = 0

    def exchange(self, step: int, samples: int) -> Exchange:

        start = time.perf_counter_ns()
        pushing = [(server, pieces) for server, pieces in zip(self.servers, self.segments,
                                                              strict=True) if pieces]
        sums = [placement.gather(self.buffer, pieces) for _, pieces in pushing]
        futures = [rpc.rpc_async(server, push, args=(
            self.version, self.clock, self.rank, values, samples))
            for (server, _), values in zip(pushing, sums, strict=True)]
        replies = []
        for (server, pieces), pushed, future in zip(pushing, sums, futures, strict=True):
            values, reply = future.wait()
            placement.scatter(values, self.buffer, pieces)
            self.sent[server] += pushed.numel() * pushed.element_size()
            self.received[server] += values.numel() * values.element_size()
            replies.append(reply)
        if self.tail is not None:  # the tail's parameters: the server's when they are read
            self.tail.fill(self.buffer, evaluated_after(self.run, step))
        self.steps_taken += 1
        end = time.perf_counter_ns()
        last = replies[-1]  # the shard that holds the loss
        clocks = [self.clocks[server] for server, _ in pushing]
        received = max(c.local(r.received_ns) for c, r in zip(clocks, replies, strict=True))
        released = max(max(c.local(r.released_ns) for c, r in zip(clocks, replies,
                                                                   strict=True)), received)
        push_ns = max(received - start, 0)
        wait_ns = released - received
        self.version = min(r.version for r in replies)
        self.clock += 1
        done = any(r.done for r in replies)
        if self.lockstep:
            following = next_step(step, self.steps)
        elif self.name == "backup":
            following = None if done else self.version
        else:
            following = None if done else step + 1
        return Exchange(Holds.PARAMETERS, last.samples, following,
                        staleness=max(r.staleness for r in replies), push_ns=push_ns,
                        wait_ns=wait_ns, pull_ns=max(end - start - push_ns - wait_ns, 0),
                        asynchronous=not self.lockstep, dropped=any(r.dropped for r in replies),
                        progress=min(r.progress for r in replies))

    def describe(self) -> dict[str, Any]:
        return {"servers": len(self.servers), "placement": self.placement}

    def server_clocks(self) -> list[dict[str, Any]]:
        """The offsets this worker applied to servers' stamps (servers on other hosts)."""
        return [c.to_dict() for c in self.clocks.values() if c.applied]

    def traffic(self) -> dict[str, Any]:
        """Bytes of tensors this worker sent to and received from each server, and over
        how many steps (analysis/measures/traffic.py)."""
        sent, received = dict(self.sent), dict(self.received)
        read = dict.fromkeys(self.servers, 0)
        if self.tail is not None:
            server = self.servers[-1]
            sent[server] += self.tail.sent
            received[server] += self.tail.received
            read[server] = self.tail.read
        # `read`: the tail's parameters fetched for evaluations and the end, apart from
        # the steps' own traffic
        return {"steps": self.steps_taken, "sent": sent, "received": received, "read": read}

    def close(self, failed: bool = False) -> None:
        if failed or not self.graceful:
            rpc.shutdown(graceful=False)
            return
        try:
            rpc.shutdown(graceful=True, timeout=self.timeout_s)
        except Exception:  # noqa: BLE001 - a peer already gone: leave without it
            rpc.shutdown(graceful=False)


def evaluated_after(run: RunSpec, step: int) -> bool:
    """Whether the parameters are read after `step`: a held-out evaluation or the end."""
    done = step + 1
    return done >= run.steps or bool(run.eval_every and done % run.eval_every == 0)


class TailClient:
    """A worker's side of fc-on-server (harness/exchange/placement.py): the layers from
    `first_layer` on are computed by `server`; the worker's copy of their parameters is
    refreshed only when they are read."""

    def __init__(self, run: RunSpec, adapter: TorchLayersAdapter, server: str) -> None:
        from hetbench.workloads.torch_layers import parameter_range

        layers = adapter.layers()
        self.first_layer = placement.tail_start(run, len(layers))
        self.lo, self.hi = parameter_range(adapter.spec, adapter.model,
                                           layers[self.first_layer:], adapter.torch_names)

        starts = shards.offsets([p.size for p in adapter.spec.params])
        self.first_tensor = starts.index(self.lo)
        self.names = [p.name for p in adapter.spec.params[self.first_tensor:]]
        self.server, self.adapter = server, adapter
        self.sent = self.received = self.read = 0

    def start(self, initial: torch.Tensor) -> None:

        spec = self.adapter.spec
        rpc.rpc_sync(self.server, placement.init_tail, args=(
            tuple(spec.sample_shape), spec.num_classes, self.first_layer,
            initial[self.lo:self.hi].clone()))

    def compute(self, features: torch.Tensor, targets: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:

        loss, grad = rpc.rpc_sync(self.server, placement.tail_step, args=(features.cpu(),
                                                               targets.cpu()))
        self.sent += (features.numel() * features.element_size()
                      + targets.numel() * targets.element_size())
        self.received += grad.numel() * grad.element_size() + loss.element_size()
        return loss.to(features.device), grad.to(features.device)

    def fill(self, buffer: torch.Tensor, pull: bool) -> None:
        """The tail's part of the buffer the loop loads as parameters: the server's when
        they are about to be read, else the worker's own copy, unchanged."""
        if pull:

            values = rpc.rpc_sync(self.server, placement.pull_tail)
            self.read += values.numel() * values.element_size()
            buffer[self.lo:self.hi].copy_(values)
        else:
            buffer[self.lo:self.hi].copy_(self.adapter.flat_params[self.lo:self.hi])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}",
                                     description="one hetbench parameter server")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--index", type=int, required=True)
    args = parser.parse_args(argv)
    return serve(args.run_dir, args.index)


if __name__ == "__main__":
    # RPC calls name this module's functions by their import path: serve from that module,
    # not from __main__, or the server state they read would be another module's
    from hetbench.harness.exchange import parameter_server

    exit_after(parameter_server.main)
