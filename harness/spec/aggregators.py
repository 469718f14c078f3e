"""The aggregators by name (how workers' gradients or parameters meet), as the suite
loader and the analysis know them before any import: each one's options, its capabilities,
and the checks of a run that uses it. Their code is in harness/exchange/, loaded by name
(`Kind.target`). Adding an aggregator is its module there plus one entry here."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetbench.harness.partition.policies import fixed_policies
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import (
    MAX_NODES,
    MAX_SERVERS,
    MAX_STEPS,
    MAX_WORKERS,
    At,
    check_keys,
    choice,
    integer,
    number,
    table,
)
from hetbench.harness.spec.frameworks import with_torch_layers
from hetbench.harness.spec.loaders import LoaderSpec
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.harness.spec.workers import WorkerSpec
from hetbench.workloads import WORKLOADS, get_workload
from hetbench.workloads.job import is_job


@dataclass(frozen=True)
class AggregatorSpec:
    """The suite's `aggregator = { name = ..., ... }` (or `strategy = name`)."""

    name: str = "torch"
    staleness: int = 0  # ssp: a worker at clock c waits until every worker reached c - s
    backup: int = 0  # backup: gradients dropped per step (the last to arrive)
    local_steps: int = 1  # local-sgd: steps between parameter averages
    servers: int = 1  # parameter servers the parameters are sharded over
    staleness_lr: str = "none"  # "dynsgd": an update is scaled by 1 / (1 + staleness)
    # the node (host) each parameter server runs on, in a run across hosts; () all on node 0
    server_nodes: tuple[int, ...] = ()
    bucket_mb: float = 25.0  # ddp: the size of a gradient bucket (DDP's bucket_cap_mb)
    # ddp: who all-reduces a bucket, DDP itself or a timed hook (COMM_HOOKS)
    comm_hook: str = "builtin"

    def server_node(self, index: int) -> int:
        """The node that runs server `index`."""
        return self.server_nodes[index] if self.server_nodes else 0


def recorded_name(run: dict[str, Any]) -> str:
    """The aggregator a recorded run's `run` table names (a manifest's): its
    `aggregator.name`, `strategy` in runs recorded before aggregators, else the default."""
    return str((run.get("aggregator") or {}).get("name") or run.get("strategy")
               or AggregatorSpec.name)


@dataclass(frozen=True)
class Simulation:
    """How `hetbench simulate` models an aggregator: by the simulator's `model` of that name
    (analysis/models/simulate.py's MODELS), its one numeric option (the AggregatorSpec key
    `option`, written `model:<letter>` in `--scheme`), whether every step applies the
    gradient of the whole global batch (BSP's: such a scheme reaches a target in BSP's
    steps), and the partition policies the model also runs, by the suffix of their
    scheme name (`bsp-profiled`: the `profiled` policy's slices)."""

    model: str
    option: str | None = None
    letter: str = ""
    exact: bool = False
    policies: tuple[tuple[str, str], ...] = ()  # (scheme-name suffix, partition policy)


# an all-reduce of gradient sums every step, as the simulator models it: slices equal, as
# given, profiled, or moved by the `model` policy between steps
_BSP = Simulation("bsp", exact=True, policies=(("profiled", "profiled"), ("adaptive", "model")))


@dataclass(frozen=True)
class Kind:
    """An aggregator as the registry knows it, before any import."""

    target: str  # "module:attr" of the class (of a coordinator-driven one: its training)
    framework: str | None = None  # the framework every worker must run (None: any mix)
    keys: tuple[str, ...] = ()  # AggregatorSpec fields it takes beside name
    lockstep: bool = True  # every worker exchanges every step together
    # the buffer may live on the GPU (nccl) when every worker is one; else host memory
    device_buffer: bool = False
    # needs a GPU worker; every GPU worker keeps its buffer on its device (allreduce-device)
    needs_gpu: bool = False
    plain_sgd: bool = False  # runs the framework's own SGD: no other optimizer, no schedule
    # its exchange can leave a worker out: an all-reduce among the others (membership)
    leaves_out: bool = False
    # waits for no other worker, so the others may go on without one that failed
    survives_worker_failure: bool = False
    pipeline_only: bool = False  # what pipelined virtual workers run; never asked for by name
    # all-reduces the gradients in buckets while the backward still runs (DDP): a step's
    # `ready` is when the worker handed over its last bucket (harness/exchange/ddp.py)
    overlaps: bool = False
    # how stale an update may be: "none" (synchronous), "unbounded", or the AggregatorSpec
    # key that bounds it ("staleness": s; "local_steps": H - 1 local steps)
    staleness_bound: str = "none"
    baseline: bool = False  # the plain all-reduce of gradient sums other schemes are set against
    # what an exchange moves: "gradients" (summed, applied by every worker or a server) or
    # "parameters" (averaged every `staleness_bound` key's steps: local SGD's period)
    moves: str = "gradients"
    # every step it exchanges, the whole buffer (the gradients and the loss) is all-reduced
    # over every worker: a ring's bytes cross each worker's link (analysis/measures/network.py)
    allreduces_buffer: bool = False
    # how `hetbench simulate` models it (None: not simulated; a recorded run of it, as of a
    # lockstep one without an option, is reproduced as BSP's all-reduce, its exchange as
    # recorded)
    simulation: Simulation | None = None
    services: str | None = None  # "module:function" starting its processes (launcher)
    prepare: str | None = None  # "module:function" run in a worker before its adapter
    # "module:function" a worker process runs instead of hetbench's training loop: the
    # framework's server, while a coordinator (one of the services) drives the training and
    # writes every worker's records (TensorFlow's ParameterServerStrategy)
    serves: str | None = None
    summary: str = ""

    @property
    def servers(self) -> bool:
        """hetbench starts parameter server processes for it (`servers` = S)."""
        return "servers" in self.keys


_ALLREDUCE = "hetbench.harness.exchange.allreduce"


_DEVICE = "hetbench.harness.exchange.device"


_NATIVE = "hetbench.harness.exchange.native"


_PS = "hetbench.harness.exchange.parameter_server"


_TF_PS = "hetbench.harness.exchange.tensorflow_ps"


_PS_KEYS = ("servers",)


# hetbench's own servers (torch.distributed.rpc), and TensorFlow's ps tasks, can run on any
# host of a run across hosts
_PLACED_PS_KEYS = (*_PS_KEYS, "server_nodes")
# MXNet's one ps-lite server too (its scheduler stays on node 0)
_MXNET_KEYS = ("server_nodes",)


_PS_START = f"{_PS}:start_servers"


AGGREGATORS: dict[str, Kind] = {
    "torch": Kind(f"{_ALLREDUCE}:Allreduce", device_buffer=True, leaves_out=True, baseline=True,
                  allreduces_buffer=True, simulation=_BSP,
                  summary="torch.distributed all-reduce of gradient sums: gloo on the host, "
                  "nccl when every worker is a GPU"),
    "allreduce-host": Kind(f"{_ALLREDUCE}:Allreduce", leaves_out=True, baseline=True,
                           allreduces_buffer=True, simulation=_BSP,
                           summary="Choi's strategy 1: "
                           "gradients to the host, summed there over gloo"),
    "allreduce-device": Kind(f"{_DEVICE}:DeviceAllreduce", needs_gpu=True,
                             summary="Choi's strategy 2: CPU workers' gradients to a GPU, "
                             "NCCL among the GPUs, the sums back to the CPUs"),
    "local-sgd": Kind(f"{_ALLREDUCE}:LocalSGD", keys=("local_steps",), device_buffer=True,
                      staleness_bound="local_steps", moves="parameters",
                      allreduces_buffer=True,
                      simulation=Simulation("local-sgd", option="local_steps", letter="H"),
                      summary="H local steps, then parameters averaged, weighted by samples"),
    "ps-sync": Kind(f"{_PS}:ParameterServerClient", keys=_PLACED_PS_KEYS, services=_PS_START,
                    simulation=Simulation("ps-sync", exact=True),
                    summary="parameter servers, synchronous: one update per step from "
                    "every worker's gradients"),
    "ps-async": Kind(f"{_PS}:ParameterServerClient", keys=(*_PLACED_PS_KEYS, "staleness_lr"),
                     lockstep=False, services=_PS_START,
                     survives_worker_failure=True,
                     staleness_bound="unbounded", simulation=Simulation("ps-async"),
                     summary="parameter servers, asynchronous: every push is applied at once"),
    "ssp": Kind(f"{_PS}:ParameterServerClient",
                keys=(*_PLACED_PS_KEYS, "staleness", "staleness_lr"),
                lockstep=False, services=_PS_START,
                staleness_bound="staleness",
                simulation=Simulation("ssp", option="staleness", letter="S"),
                summary="stale-synchronous: asynchronous within a staleness bound"),
    "wsp": Kind(f"{_PS}:ParameterServerClient", keys=(*_PS_KEYS, "staleness"),
                lockstep=False, services=_PS_START, pipeline_only=True,
                staleness_bound="staleness",
                summary="wave-synchronous: virtual workers (pipelines) push each wave to "
                "one server per stage, at most `staleness` waves apart (set by "
                "pipeline.wave_bound)"),
    "backup": Kind(f"{_PS}:ParameterServerClient", keys=(*_PLACED_PS_KEYS, "backup"),
                   lockstep=False, services=_PS_START,
                   simulation=Simulation("backup", option="backup", letter="B"),
                   summary="synchronous over the first n - b gradients of each step"),
    "ddp": Kind("hetbench.harness.exchange.ddp:DDPAllreduce", framework="pytorch",
                keys=("bucket_mb", "comm_hook"),
                device_buffer=True, overlaps=True,
                summary="PyTorch DistributedDataParallel: gradient sums all-reduced in "
                "buckets of bucket_mb while the backward runs"),
    "mxnet-kvstore": Kind(f"{_NATIVE}:KVStoreAllreduce", framework="mxnet", device_buffer=True,
                          keys=_MXNET_KEYS, services=f"{_NATIVE}:start_kvstore",
                          summary="MXNet's ps-lite kvstore, dist_sync"),
    "mxnet-async": Kind(f"{_NATIVE}:KVStoreAsync", framework="mxnet", lockstep=False,
                        staleness_bound="unbounded", keys=_MXNET_KEYS,
                        simulation=Simulation("ps-async"),
                        services=f"{_NATIVE}:start_kvstore",
                        plain_sgd=True,
                        summary="MXNet's ps-lite kvstore, dist_async, SGD on its server"),
    "tensorflow-collective": Kind(f"{_NATIVE}:TensorFlowCollective", framework="tensorflow",
                                  allreduces_buffer=True,
                                  services=f"{_NATIVE}:start_tensorflow_ports",
                                  prepare=f"{_NATIVE}:prepare_tensorflow",
                                  summary="TensorFlow's ring all-reduce "
                                  "(MultiWorkerMirroredStrategy)"),
    "tensorflow-ps": Kind("hetbench.harness.loop.tensorflow_coordinator:train",
                          framework="tensorflow", keys=_PLACED_PS_KEYS, lockstep=False,
                          staleness_bound="unbounded",
                          plain_sgd=True, services=f"{_TF_PS}:start_services",
                          serves=f"{_TF_PS}:serve_worker",
                          summary="TensorFlow's ParameterServerStrategy: a coordinator hands "
                          "each step to whichever worker server is free, SGD on the ps"),
}


# How a parameter-server aggregator places the layers (the run's `placement`): tensors
# dealt round-robin over the servers (TensorFlow's default), contiguous shards balanced by
# bytes (the default), or the fully connected tail computed on a server (arXiv 1901.05803).
PLACEMENTS = ("data-parallel", "sharded", "fc-on-server")


SPEC_KEYS = ("staleness", "backup", "local_steps", "servers", "staleness_lr", "server_nodes",
             "bucket_mb", "comm_hook")
MAX_BUCKET_MB = 1024.0
# ddp: DDP's own all-reduce in C++ (each bucket's ready recorded), or hetbench's comm hook in
# Python, which also records when each bucket's all-reduce was done and costs a few percent
# of a step (harness/exchange/ddp.py)
COMM_HOOKS = ("builtin", "timed")


STALENESS_LR = ("none", "dynsgd")


def kind(name: str) -> Kind:
    try:
        return AGGREGATORS[name]
    except KeyError:
        raise ValueError(f"unknown aggregator {name!r} (allowed: "
                         f"{', '.join(sorted(AGGREGATORS))})") from None


def problem(spec: AggregatorSpec, workers: Sequence[Any]) -> tuple[str, str] | None:
    """(field, why) when these workers (WorkerSpec: framework, device) cannot use this
    aggregator, or None."""
    k, n = kind(spec.name), len(workers)
    frameworks = [w.framework for w in workers]
    if k.framework is not None:
        for i, framework in enumerate(frameworks):
            if framework != k.framework:
                return ("name", f"{spec.name!r} needs every worker on {k.framework} (worker "
                        f"{i} is {framework}); use 'torch' or another aggregator for mixed "
                        "jobs")
    if k.needs_gpu:
        gpus = [w.device for w in workers if w.is_cuda]
        if not gpus:
            return ("name", f"{spec.name!r} sums on GPUs: it needs at least one worker on a "
                    "cuda device (use 'allreduce-host' when every worker is a CPU)")
        if len(set(gpus)) < len(gpus):
            return ("name", f"{spec.name!r} runs NCCL among the GPU workers, which needs "
                    f"each on its own GPU (devices: {', '.join(gpus)})")
    if spec.backup >= n and spec.name == "backup":
        return ("backup", f"{spec.backup} is not allowed (0 to {n - 1}: backup workers "
                "must be fewer than the workers)")
    if spec.name == "backup" and spec.servers > 1:
        return ("servers", f"{spec.servers} is not allowed (backup decides which gradients "
                "count in one place: servers = 1)")
    return None


def check_coordinated(name: str, partition: PartitionSpec, workload: str,
                      loader: LoaderSpec | None, values: dict[str, Any], at: At) -> None:
    """A coordinator-driven aggregator (tensorflow-ps) runs no hetbench loop in the workers:
    what that loop does (measure to partition or calibrate, load, transform, run bare) it
    cannot. Nothing to check for an aggregator that runs in hetbench's loop."""
    if kind(name).serves is None:
        return
    fixed = fixed_policies()
    if partition.policy not in fixed:
        raise UsageError(at("partition.policy"), f"{partition.policy!r} measures the workers "
                         f"in hetbench's loop, which {name!r} does not run (its workers are "
                         f"TensorFlow servers): allowed: {', '.join(fixed)}")
    if loader is not None:
        raise UsageError(at("loader"), f"{name!r} feeds each worker through a tf.data "
                         "pipeline on the worker: leave loader unset")
    if get_workload(workload).prepare is not None:
        allowed = sorted(n for n in WORKLOADS if get_workload(n).prepare is None)
        raise UsageError(at("workload"), f"{workload!r} transforms each batch in hetbench's "
                         f"loop, which {name!r} does not run (allowed: {', '.join(allowed)})")
    if values["calibrate"] is True:
        raise UsageError(at("calibrate"), f"calibration times each worker alone in "
                         f"hetbench's loop, which {name!r} does not run: calibrate = false")
    if values["instrument"] is False:
        raise UsageError(at("instrument"), f"{name!r} always times its step functions (on the "
                         "worker, tf.timestamp): instrument = true")


def parse_placement(values: dict[str, Any], aggregator: AggregatorSpec, workload: str,
                    workers: Sequence[WorkerSpec], at: At) -> str | None:
    """`placement = "data-parallel" | "sharded" | "fc-on-server"`: how a parameter-server
    aggregator places the layers (harness/exchange/parameter_server.py)."""
    raw = values["placement"]
    if raw is None:
        return None
    where = at("placement")
    placement = choice(raw, PLACEMENTS, where)
    if aggregator.name not in (placing := places_layers()):
        raise UsageError(where, f"places layers on parameter servers: it needs aggregator "
                         f"{', '.join(placing[:-1])} or {placing[-1]}, not "
                         f"{aggregator.name!r}")
    if placement == "fc-on-server":
        if aggregator.name != "ps-sync":
            raise UsageError(where, "'fc-on-server' updates the server's layers once per "
                             f"step from every worker: aggregator 'ps-sync', not "
                             f"{aggregator.name!r}")
        # a job's tail is its last layer (Job.layers): the job check knows whether it has any
        if not is_job(workload) and get_workload(workload).fc_layers is None:
            placed = sorted(n for n in WORKLOADS if get_workload(n).fc_layers is not None)
            raise UsageError(where, f"{workload!r} has no convolutional layers to keep on "
                             f"the workers (allowed: {', '.join(placed)}, or a job named by "
                             "import path that gives its layers)")
        if any(w.framework not in (able := with_torch_layers()) for w in workers):
            raise UsageError(where, "'fc-on-server' runs the workers' layers in PyTorch: "
                             f"every worker on framework {' or '.join(repr(n) for n in able)}")
    return placement


def parse_aggregator(values: dict[str, Any], workers: Sequence[WorkerSpec], at: At
                     ) -> AggregatorSpec:
    """`aggregator = "ps-sync"` or `{ name = "ssp", staleness = 2, servers = 2, ... }`; the
    older `strategy = name` means `aggregator = name`."""
    raw, where = values["aggregator"], at("aggregator")
    if values["strategy"] is not None:
        if raw is not None:
            raise UsageError(at("strategy"), "give aggregator or strategy (its older name), "
                             "not both")
        raw, where = values["strategy"], at("strategy")
    if raw is None:
        raw = AggregatorSpec.name
    if isinstance(raw, str):
        raw, where_name = {"name": raw}, where
    else:
        raw, where_name = table(raw, where), f"{where}.name"
    check_keys(raw, {"name", *SPEC_KEYS}, where)
    name = choice(raw.get("name", AggregatorSpec.name), AGGREGATORS, where_name)
    allowed = kind(name).keys
    for key in raw:
        if key != "name" and key not in allowed:
            takes = f"takes only {', '.join(allowed)}" if allowed else "takes no options"
            raise UsageError(f"{where}.{key}", f"not an option of {name!r} ({name!r} {takes})")
    default = AggregatorSpec()
    spec = AggregatorSpec(
        name=name,
        staleness=integer(raw.get("staleness", default.staleness), f"{where}.staleness",
                          minimum=0, maximum=MAX_STEPS),
        backup=integer(raw.get("backup", default.backup), f"{where}.backup", minimum=0,
                       maximum=MAX_WORKERS),
        local_steps=integer(raw.get("local_steps", default.local_steps),
                            f"{where}.local_steps", minimum=1, maximum=MAX_STEPS),
        servers=integer(raw.get("servers", default.servers), f"{where}.servers", minimum=1,
                        maximum=MAX_SERVERS),
        staleness_lr=choice(raw.get("staleness_lr", default.staleness_lr), STALENESS_LR,
                            f"{where}.staleness_lr"),
        bucket_mb=number(raw.get("bucket_mb", default.bucket_mb), f"{where}.bucket_mb",
                         minimum=0.0, maximum=MAX_BUCKET_MB, strict=True),
        comm_hook=choice(raw.get("comm_hook", default.comm_hook), COMM_HOOKS,
                         f"{where}.comm_hook"),
    )
    if "server_nodes" in raw:
        spec = dataclasses.replace(spec, server_nodes=_server_nodes(
            raw["server_nodes"], spec.servers, f"{where}.server_nodes"))
    if (found := problem(spec, workers)) is not None:
        key, why = found
        raise UsageError(where_name if key == "name" else f"{where}.{key}", why)
    return spec


def _server_nodes(raw: Any, servers: int, where: str) -> tuple[int, ...]:
    """`server_nodes = [0, 1]`: the node of each of the `servers` servers."""
    if not isinstance(raw, list) or len(raw) != servers:
        raise UsageError(where, f"{raw!r} is not allowed: a list of {servers} node "
                         f"number(s), one per server (servers = {servers})")
    return tuple(integer(node, f"{where}[{k}]", minimum=0, maximum=MAX_NODES)
                 for k, node in enumerate(raw))


def places_layers() -> list[str]:
    """The aggregators whose parameter servers a run's `placement` can place layers on."""
    return [name for name, k in AGGREGATORS.items()
            if k.servers and not k.pipeline_only and k.serves is None]


def check_partition(aggregator: AggregatorSpec, partition: PartitionSpec, at: At) -> None:
    """What the run's partition asks of its aggregator: an adaptive policy repartitions
    every worker at the same steps; a worker left out needs an exchange among the others."""
    if partition.adaptive and not kind(aggregator.name).lockstep:
        raise UsageError(at("partition.policy"), f"{partition.policy!r} repartitions every "
                         f"worker at the same steps: it needs a lockstep aggregator, not "
                         f"{aggregator.name!r}")
    if partition.may_leave_out and not kind(aggregator.name).leaves_out:
        what = "leave_out" if partition.leave_out else "sizes"
        able = ", ".join(n for n, k in AGGREGATORS.items() if k.leaves_out)
        raise UsageError(at(f"partition.{what}"), "a worker left out (an empty slice) needs "
                         f"an all-reduce aggregator ({able}), not {aggregator.name!r}")


def check_on_worker_failure(aggregator: AggregatorSpec, on_failure: str, at: At) -> None:
    """`on_worker_failure = "continue"`: only a scheme that waits for no other worker."""
    able = [n for n, k in AGGREGATORS.items() if k.survives_worker_failure]
    if on_failure == "continue" and aggregator.name not in able:
        raise UsageError(at("on_worker_failure"), "'continue' needs aggregator "
                         f"{' or '.join(repr(n) for n in able)} (the one scheme that waits "
                         f"for no other worker), not {aggregator.name!r}")


def check_optimizer(aggregator: AggregatorSpec, plain: bool, at: At) -> None:
    """An aggregator that runs its framework's own SGD on the server takes no other
    optimizer (`plain`: the run's optimizer is the default, plain SGD)."""
    if kind(aggregator.name).plain_sgd and not plain:
        raise UsageError(at("optimizer"), f"{aggregator.name!r} runs its framework's own "
                         "SGD on the server: plain 'sgd' only, no weight decay or schedule")


def check_without_pipeline(aggregator: AggregatorSpec, at: At) -> None:
    """An aggregator only pipelines run, asked for without them."""
    if kind(aggregator.name).pipeline_only:
        raise UsageError(at("aggregator"), f"{aggregator.name!r} is what virtual_workers with "
                         "pipeline.wave_bound > 0 run; it takes no aggregator key")
