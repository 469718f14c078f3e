"""Framework-native aggregation strategies, for cross-checks against torch.distributed.

A strategy replaces only the all-reduce of the gradient buffer; everything else (rendezvous,
clock offsets, barriers, the records) still goes through torch.distributed. Strategies:

- "torch": torch.distributed all-reduce (gloo, or nccl when every worker is a GPU). Default.
- "mxnet-kvstore": MXNet's parameter server in `dist_sync` mode. The launcher starts the
  ps-lite scheduler and one server on 127.0.0.1 through the DMLC_* variables and stops
  them at the end; each worker pushes its gradient buffer and pulls the sum of all
  workers' pushes (no server-side optimizer: the server stores each round's sum). ps-lite
  has no timeout: a dead peer is caught by the launcher's stall watchdog, not here.
- "tensorflow-collective": TensorFlow's collective all-reduce (MultiWorkerMirroredStrategy,
  RING implementation: gRPC between the workers' own TF servers on 127.0.0.1). The
  launcher gives every worker the same list of ports; each worker creates the strategy as
  its task `worker:<rank>` before TensorFlow runs any op (prepare), as TensorFlow requires.
  The torch buffer enters TF zero-copy (DLPack) and the sum is copied back into it, so
  the allreduce phase of this strategy includes one copy of the buffer.

This module imports no framework at module level: the launcher uses it too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# strategy -> the framework every worker must run (None: any mix)
STRATEGIES: dict[str, str | None] = {"torch": None, "mxnet-kvstore": "mxnet",
                                     "tensorflow-collective": "tensorflow"}
TF_WORKERS_ENV = "HETBENCH_TF_WORKERS"  # "host:port,host:port,...", rank order
KVSTORE_MODE = "dist_sync"
STOP_GRACE_S = 5.0

# Importing mxnet with DMLC_ROLE=scheduler/server runs that role's loop, then exits.
_PS_ROLE = ("import numpy\nif 'bool' not in vars(numpy):\n    numpy.bool = bool\n"
            "import mxnet\n")


def strategy_problem(strategy: str, frameworks: list[str]) -> str | None:
    """Why the workers' frameworks cannot use this strategy, or None."""
    needed = STRATEGIES[strategy]
    for i, framework in enumerate(frameworks):
        if needed is not None and framework != needed:
            return (f"{strategy!r} needs every worker on {needed} (worker {i} is "
                    f"{framework}); use strategy 'torch' for mixed jobs")
    return None


@dataclass
class Services:
    """Processes a strategy needs beside the workers, and what the workers must be told."""

    env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        """The servers exit once every worker has left; stop any that did not, by PID."""
        for p in self.procs:
            try:
                p.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def start_services(strategy: str, world_size: int, free_port: Callable[[], int],
                   logs: Path) -> Services:
    if strategy == "tensorflow-collective":
        # Each worker's TF server listens on its own port; the workers find each other there.
        workers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(world_size))
        return Services(env={TF_WORKERS_ENV: workers})
    if strategy != "mxnet-kvstore":
        return Services()
    port = free_port()
    env = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": str(world_size),
           "DMLC_INTERFACE": "lo", "PS_VERBOSE": "0"}
    services = Services(env={**env, "DMLC_ROLE": "worker"})
    for role in ("scheduler", "server"):
        with open(logs / f"kvstore-{role}.log", "wb") as log:
            services.procs.append(subprocess.Popen(
                [sys.executable, "-c", _PS_ROLE], env={**os.environ, **env, "DMLC_ROLE": role},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True))
    return services


_tf_strategy: Any = None


def prepare(strategy: str, rank: int, world_size: int, threads: int) -> None:
    """Work a strategy must do before the adapter exists: TensorFlow's collectives must be
    configured before its runtime runs a single op (and its thread pools before that)."""
    global _tf_strategy
    if strategy != "tensorflow-collective":
        return
    from adapters.tensorflow import configure_threads, tf

    workers = os.environ.get(TF_WORKERS_ENV, "").split(",")
    if len(workers) != world_size or not all(workers):
        raise RuntimeError(f"{TF_WORKERS_ENV} must list {world_size} host:port entries "
                           "(hetbench run sets it; torchrun mode does not support this "
                           "strategy)")
    configure_threads(threads)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": workers}), task_type="worker", task_id=rank)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    _tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)


def allreduce(strategy: str, adapter: Any, world_size: int
              ) -> Callable[[Any], None] | None:
    """The strategy's replacement for comm.allreduce_sum, or None for "torch"."""
    if strategy == "torch":
        return None
    if strategy == "mxnet-kvstore":
        return _kvstore_allreduce(adapter, world_size)
    if strategy == "tensorflow-collective":
        return _tf_collective_allreduce(adapter)
    raise ValueError(f"unknown strategy {strategy!r}")


def _kvstore_allreduce(adapter: Any, world_size: int) -> Callable[[Any], None]:
    """Push and pull the adapter's flat MXNet gradient array, which the torch buffer aliases:
    the sums land where the worker reads them."""
    import mxnet as mx  # the worker runs the MXNet adapter, so it is imported already

    kv = mx.kv.create(KVSTORE_MODE)
    if kv.num_workers != world_size:  # an unknown store type silently becomes local
        raise RuntimeError(f"kvstore {KVSTORE_MODE} has {kv.num_workers} workers, "
                           f"expected {world_size}")
    grads = adapter.flat_grads
    kv.init(0, mx.nd.zeros(grads.shape, ctx=grads.context))

    def reduce(buffer: Any) -> None:
        kv.push(0, grads)
        kv.pull(0, out=grads)
        grads.wait_to_read()  # the worker reads the loss slot through torch next

    return reduce


def _tf_collective_allreduce(adapter: Any) -> Callable[[Any], None]:
    """Sum the torch buffer over the workers with TensorFlow's ring all-reduce."""
    from torch.utils.dlpack import from_dlpack, to_dlpack

    from adapters.tensorflow import tf

    strategy = _tf_strategy
    if strategy is None:
        raise RuntimeError("tensorflow-collective: prepare() was not called before the adapter")
    buffer = adapter.comm_buffer(False)

    def replica_sum(x: Any) -> Any:
        # identity places the input on the replica's device; all_reduce needs one
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                              tf.identity(x))

    @tf.function(input_signature=[tf.TensorSpec(tuple(buffer.shape), tf.float32)])
    def all_reduce(x: Any) -> Any:
        return strategy.experimental_local_results(strategy.run(replica_sum, args=(x,)))[0]

    def reduce(buffer: Any) -> None:
        total = all_reduce(tf.experimental.dlpack.from_dlpack(to_dlpack(buffer)))
        buffer.copy_(from_dlpack(tf.experimental.dlpack.to_dlpack(total)))

    return reduce
