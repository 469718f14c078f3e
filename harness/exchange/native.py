"""Framework-native aggregators, for cross-checks against torch.distributed.

They replace only the sum of the gradient buffer; everything else (rendezvous, clock
offsets, barriers, the records) still goes through torch.distributed.

- "mxnet-kvstore": MXNet's parameter server in `dist_sync` mode. The launcher starts the
  ps-lite scheduler and one server (on 127.0.0.1; across hosts, the scheduler on node 0
  and the server on the node `server_nodes` names) through the DMLC_* variables and stops
  them at the end; each worker pushes its gradient buffer and pulls the sum of all
  workers' pushes (no server-side optimizer: the server stores each round's sum). ps-lite
  has no timeout: a dead peer is caught by the launcher's stall watchdog, not here.
- "mxnet-async": MXNet's kvstore in `dist_async` mode, the same scheduler and server, with
  MXNet's SGD running on the server (KVStoreAsync): a native cross-check of ps-async.
- "tensorflow-collective": TensorFlow's collective all-reduce (MultiWorkerMirroredStrategy,
  RING implementation: gRPC between the workers' own TF servers on 127.0.0.1). The
  launcher gives every worker the same list of ports (across hosts the workers pick
  their own and exchange them over torch.distributed); each worker creates the strategy as
  its task `worker:<rank>` before TensorFlow runs any op (prepare), as TensorFlow requires.
  The torch buffer enters TF zero-copy (DLPack) and the sum is copied back into it, so
  the exchange phase of this aggregator includes one copy of the buffer.
  TensorFlow's gRPC server listens on "0.0.0.0:<port>" (every interface, IPv6 included)
  whatever host the cluster spec names, and has no setting for the address it binds
  (issue 18): the launcher starts these workers in a network namespace of their own whose
  only interface is loopback (harness/system/netns.py). Where namespaces are not allowed the run
  goes on in the host's network, with a warning and the reason in the manifest.

This module imports no framework at module level: the launcher uses it too.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hetbench.harness.exchange import Context, Exchange, Holds, next_step
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.system import interfaces
from hetbench.harness.system.services import Services

if TYPE_CHECKING:
    from hetbench.adapters.mxnet import MXNetAdapter

TF_WORKERS_ENV = "HETBENCH_TF_WORKERS"  # "host:port,host:port,...", rank order
# rank r's TensorFlow server in the run's private namespace: below Linux's ephemeral ports
# (32768-60999 by default), so no connection's local port can be it
PRIVATE_TF_PORT = 20000
KVSTORE_MODE = "dist_sync"
ASYNC_KVSTORE_MODE = "dist_async"

# Importing mxnet with DMLC_ROLE=scheduler/server runs that role's loop, then exits.
_PS_ROLE = ("import numpy\nif 'bool' not in vars(numpy):\n    numpy.bool = bool\n"
            "import mxnet\n")


def start_tensorflow_ports(run: RunSpec, free_port: Callable[[], int], logs: Path,
                           run_dir: Path, services: Services) -> None:
    """Each worker's TF server listens on its own port; the workers find each other there.
    TensorFlow binds those ports on every interface: on one host, in the run's private
    namespace (Services.make_private) every interface is loopback. Across hosts no launcher
    knows which ports are free on another host: the workers pick their own and exchange
    them (prepare_tensorflow), and TensorFlow's servers listen on every interface of each
    host, which the launcher says."""
    if services.across_hosts:
        warn_every_interface()
        return
    if services.holder is not None:
        # The run's own namespace: nothing but the run binds there. Ports below the
        # ephemeral range, from which every other socket of the run bound to port 0 (gloo's
        # listeners and connections, the store's clients) draws: a port free_port() found
        # free in the host's network was once taken in the namespace before TensorFlow
        # bound it (a clean-clone CI run, 2026-11-27: "Could not start gRPC server").
        ports = [PRIVATE_TF_PORT + rank for rank in range(run.world_size)]
    else:
        ports = [free_port() for _ in range(run.world_size)]
    services.env[TF_WORKERS_ENV] = ",".join(f"127.0.0.1:{port}" for port in ports)


def warn_every_interface() -> None:
    print("   warning: TensorFlow's servers listen on every interface of each host (it has "
          "no setting for the address they bind)", flush=True)


def start_kvstore(run: RunSpec, free_port: Callable[[], int], logs: Path, run_dir: Path,
                  services: Services) -> None:
    """ps-lite's scheduler and one server. Every ps-lite node listens (a ZMQ router
    socket): the scheduler on DMLC_PS_ROOT_URI, the server and the workers on
    DMLC_INTERFACE's address (without it, the first interface's: not loopback). On one
    host all on 127.0.0.1, in the run's private namespace. Across hosts the scheduler runs
    on node 0 at the master's address, the server on the node `server_nodes` names, and
    every ps-lite node binds its host's interface towards node 0 (services.binding)."""
    env = {"DMLC_PS_ROOT_URI": services.address, "DMLC_PS_ROOT_PORT": str(free_port()),
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": str(run.world_size),
           "DMLC_INTERFACE": services.binding.get("DMLC_INTERFACE", "lo"), "PS_VERBOSE": "0"}
    services.env.update({**env, "DMLC_ROLE": "worker"})
    here = {"scheduler": services.node == 0,
            "server": run.aggregator.server_node(0) == services.node}
    for role in ("scheduler", "server"):
        if here[role]:
            services.start(f"kvstore-{role}", [sys.executable, "-c", _PS_ROLE],
                           {**os.environ, **env, "DMLC_ROLE": role}, logs)


_tf_strategy: Any = None


def prepare_tensorflow(run: RunSpec, rank: int) -> None:
    """TensorFlow's collectives must be configured before its runtime runs a single op (and
    its thread pools before that): before the adapter exists."""
    global _tf_strategy
    from hetbench.adapters.tensorflow import configure_threads, tf

    world_size, threads = run.world_size, run.workers[rank].threads

    listed = os.environ.get(TF_WORKERS_ENV)
    workers = listed.split(",") if listed else _exchanged_addresses()
    if len(workers) != world_size or not all(workers):
        raise RuntimeError(f"{TF_WORKERS_ENV} must list {world_size} host:port entries "
                           f"(hetbench run sets it on one host): {workers}")
    configure_threads(threads)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": workers}), task_type="worker", task_id=rank)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    _tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)


def _exchanged_addresses() -> list[str]:
    """Across hosts: every worker's TF server address, in rank order. Each worker takes a
    port free on every interface of its host (TensorFlow binds them all) and its address
    on the interface its libraries bind (GLOO_SOCKET_IFNAME), sent to the others over the
    workers' torch.distributed group as two float64 (an IPv4 address and a port are exact
    in them)."""
    import torch

    from hetbench.harness.exchange import comm

    address, port = interfaces.endpoint(os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    mine = [float(int(ipaddress.IPv4Address(address))), float(port)]
    return [f"{ipaddress.IPv4Address(int(a))}:{int(p)}"
            for a, p in comm.all_gather_vectors(mine, torch.device("cpu"))]


class KVStoreAllreduce:
    """Push and pull the adapter's flat MXNet gradient array, which the torch buffer aliases:
    the sums land where the worker reads them."""

    def __init__(self, context: Context) -> None:
        import mxnet as mx  # the worker runs the MXNet adapter, so it is imported already

        world_size = context.run.world_size
        self.kv = mx.kv.create(KVSTORE_MODE)
        if self.kv.num_workers != world_size:  # an unknown store type silently becomes local
            raise RuntimeError(f"kvstore {KVSTORE_MODE} has {self.kv.num_workers} workers, "
                               f"expected {world_size}")
        self.grads = cast("MXNetAdapter", context.adapter).flat_grads  # every worker's MXNet
        self.kv.init(0, mx.nd.zeros(self.grads.shape, ctx=self.grads.context))
        self.steps, self.global_batch = context.run.steps, context.run.global_batch

    def exchange(self, step: int, samples: int) -> Exchange:
        self.kv.push(0, self.grads)
        self.kv.pull(0, out=self.grads)
        self.grads.wait_to_read()  # the worker reads the loss slot through torch next
        return Exchange(Holds.SUMS, self.global_batch, next_step(step, self.steps))

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self, failed: bool = False) -> None:
        leave_kvstore(self, failed)


def leave_kvstore(aggregator: Any, failed: bool) -> None:
    """Free the kvstore now: its destructor is how ps-lite ends (a barrier of the workers,
    then worker 0 stops the server, and the scheduler exits), and a worker ends without
    the interpreter's teardown (harness/system/exits.py). After a failure the barrier could wait
    forever for a dead peer (ps-lite has no timeout): the launcher stops the services."""
    if not failed:
        aggregator.kv = None


class KVStoreAsync:
    """MXNet's own asynchronous parameter server (`dist_async`): the server runs MXNet's SGD
    with rescale_grad = 1 / global batch, so each push moves the weights by its share of a
    global step, as hetbench's ps-async does; the worker pushes its gradient sums and pulls
    the weights into the buffer. The optimizer is set (by worker 0) before any worker
    pushes: an MXNet async server that gets a push first dies. Each worker takes `steps`
    steps (MXNet keeps no shared sample budget), and the staleness of an update is not
    reported by MXNet: recorded as -1. The whole exchange is its communication (push_ns):
    MXNet does not split it, and no worker waits for another."""

    def __init__(self, context: Context) -> None:
        import mxnet as mx
        import torch.distributed as dist

        run = context.run
        self.kv = mx.kv.create(ASYNC_KVSTORE_MODE)
        if self.kv.num_workers != run.world_size:
            raise RuntimeError(f"kvstore {ASYNC_KVSTORE_MODE} has {self.kv.num_workers} "
                               f"workers, expected {run.world_size}")
        adapter = cast("MXNetAdapter", context.adapter)  # every worker runs MXNet
        self.grads = adapter.flat_grads[: adapter.spec.num_elements]  # the loss slot stays
        self.kv.init(0, adapter.flat_params.copy())  # worker 0's value; a barrier inside
        if context.rank == 0:
            self.kv.set_optimizer(mx.optimizer.SGD(learning_rate=run.lr, momentum=0.0,
                                                   wd=0.0, rescale_grad=1.0 / run.global_batch))
        dist.barrier()  # nobody pushes before the server has its optimizer
        self.steps = run.steps

    def exchange(self, step: int, samples: int) -> Exchange:
        start = time.perf_counter_ns()
        self.kv.push(0, self.grads)
        self.kv.pull(0, out=self.grads)
        self.grads.wait_to_read()  # torch reads the buffer next
        # MXNet does not say how the exchange splits into push, server and pull: all of it
        # is recorded as communication (push_ns); dist_async waits for no other worker
        return Exchange(Holds.PARAMETERS, samples, next_step(step, self.steps),
                        staleness=-1, push_ns=time.perf_counter_ns() - start,
                        asynchronous=True)

    def describe(self) -> dict[str, Any]:
        return {"servers": 1, "mode": ASYNC_KVSTORE_MODE}

    def close(self, failed: bool = False) -> None:
        leave_kvstore(self, failed)


class TensorFlowCollective:
    """Sum the torch buffer over the workers with TensorFlow's ring all-reduce."""

    def __init__(self, context: Context) -> None:
        from hetbench.adapters.tensorflow import tf

        strategy = _tf_strategy
        if strategy is None:
            raise RuntimeError("tensorflow-collective: prepare_tensorflow() was not called "
                               "before the adapter")
        self.buffer = context.buffer
        self.steps, self.global_batch = context.run.steps, context.run.global_batch

        def replica_sum(x: Any) -> Any:
            # identity places the input on the replica's device; all_reduce needs one
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                                  tf.identity(x))

        @tf.function(input_signature=[tf.TensorSpec(tuple(self.buffer.shape), tf.float32)])
        def all_reduce(x: Any) -> Any:
            return strategy.experimental_local_results(strategy.run(replica_sum, args=(x,)))[0]

        self._all_reduce = all_reduce

    def exchange(self, step: int, samples: int) -> Exchange:
        from torch.utils.dlpack import from_dlpack, to_dlpack

        from hetbench.adapters.tensorflow import tf

        total = self._all_reduce(tf.experimental.dlpack.from_dlpack(to_dlpack(self.buffer)))
        self.buffer.copy_(from_dlpack(tf.experimental.dlpack.to_dlpack(total)))
        return Exchange(Holds.SUMS, self.global_batch, next_step(step, self.steps))

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self, failed: bool = False) -> None:
        pass
