"""How workers' gradients or parameters meet: one interface, a registry of implementations.

The training loop (harness/loop/worker.py) calls `exchange(step, samples)` once per step, after
the worker's gradient sums and loss sum are in the communication buffer, and times the
call as the step's exchange phase (`allreduce_ns`, ready -> reduced). What the buffer
holds when it returns says what the loop does next (`Holds`):

- SUMS: gradient sums over `samples` samples (an all-reduce): the loop's optimizer turns
  them into the update, the adapter applies it;
- UPDATE: an update direction already computed, applied with `scale` (local SGD's local
  steps, whose optimizer runs on the worker's own samples);
- PARAMETERS: the new parameters (a parameter server's pull, local SGD's average): the
  adapter loads them.

The loop stays the one place phases are timed. An aggregator whose exchange has parts the
loop cannot see (a push to a server, a wait for other workers or a staleness bound, a
pull) reports their durations in the Exchange, measured on the host clock every process
of the host shares, and the records carry them (push_ns, wait_ns, pull_ns, staleness).

`asynchronous` says that the workers did not take this step's exchange together (a
parameter server's asynchronous push, a local step): then the aggregator measured each
worker's own wait, and that is its idle time. Otherwise (an all-reduce: every worker took
it together) idle is read off the records as always, arrival - ready (DESIGN.md,
docs/concepts/step.md).
A record of zeros is a synchronous step, as every record before aggregators was.

This module imports no framework: config validation and the launcher use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from harness.system.services import Services


class Holds(StrEnum):
    SUMS = "sums"
    UPDATE = "update"
    PARAMETERS = "parameters"


@dataclass(frozen=True)
class Exchange:
    """What one exchange did. `next_step` is the step this worker computes next (None: the
    run's budget is spent); `samples` are the samples the buffer's loss sum covers."""

    holds: Holds
    samples: int
    next_step: int | None
    scale: float = 0.0  # UPDATE only
    staleness: int = 0  # server version at apply minus the version computed on
    push_ns: int = 0
    wait_ns: int = 0
    pull_ns: int = 0
    asynchronous: bool = False
    dropped: bool = False  # the gradient arrived too late and was not used (backup)
    progress: int | None = None  # global steps applied after it (None: step + 1)


class Aggregator(Protocol):
    def exchange(self, step: int, samples: int) -> Exchange: ...

    def describe(self) -> dict[str, Any]:
        """What the manifest records of it (a parameter server's placement)."""
        ...

    def close(self, failed: bool = False) -> None:
        """The run ended; `failed`: by an error, so the peers may be gone or stuck: leave
        without waiting for them."""
        ...


@dataclass(frozen=True)
class AggregatorSpec:
    """The suite's `aggregator = { name = ..., ... }` (or `strategy = name`)."""

    name: str = "torch"
    staleness: int = 0  # ssp: a worker at clock c waits until every worker reached c - s
    backup: int = 0  # backup: gradients dropped per step (the last to arrive)
    local_steps: int = 1  # local-sgd: steps between parameter averages
    servers: int = 1  # parameter servers the parameters are sharded over
    staleness_lr: str = "none"  # "dynsgd": an update is scaled by 1 / (1 + staleness)


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


_ALLREDUCE = "harness.exchange.allreduce"
_DEVICE = "harness.exchange.device"
_NATIVE = "harness.exchange.native"
_PS = "harness.exchange.parameter_server"
_TF_PS = "harness.exchange.tensorflow_ps"
_PS_KEYS = ("servers",)
_PS_START = f"{_PS}:start_servers"
AGGREGATORS: dict[str, Kind] = {
    "torch": Kind(f"{_ALLREDUCE}:Allreduce", device_buffer=True,
                  summary="torch.distributed all-reduce of gradient sums: gloo on the host, "
                  "nccl when every worker is a GPU"),
    "allreduce-host": Kind(f"{_ALLREDUCE}:Allreduce", summary="Choi's strategy 1: "
                           "gradients to the host, summed there over gloo"),
    "allreduce-device": Kind(f"{_DEVICE}:DeviceAllreduce", needs_gpu=True,
                             summary="Choi's strategy 2: CPU workers' gradients to a GPU, "
                             "NCCL among the GPUs, the sums back to the CPUs"),
    "local-sgd": Kind(f"{_ALLREDUCE}:LocalSGD", keys=("local_steps",), device_buffer=True,
                      summary="H local steps, then parameters averaged, weighted by samples"),
    "ps-sync": Kind(f"{_PS}:ParameterServerClient", keys=_PS_KEYS, services=_PS_START,
                    summary="parameter servers, synchronous: one update per step from "
                    "every worker's gradients"),
    "ps-async": Kind(f"{_PS}:ParameterServerClient", keys=(*_PS_KEYS, "staleness_lr"),
                     lockstep=False, services=_PS_START,
                     summary="parameter servers, asynchronous: every push is applied at once"),
    "ssp": Kind(f"{_PS}:ParameterServerClient", keys=(*_PS_KEYS, "staleness", "staleness_lr"),
                lockstep=False, services=_PS_START,
                summary="stale-synchronous: asynchronous within a staleness bound"),
    "wsp": Kind(f"{_PS}:ParameterServerClient", keys=(*_PS_KEYS, "staleness"),
                lockstep=False, services=_PS_START,
                summary="wave-synchronous: virtual workers (pipelines) push each wave to "
                "one server per stage, at most `staleness` waves apart (set by "
                "pipeline.wave_bound)"),
    "backup": Kind(f"{_PS}:ParameterServerClient", keys=(*_PS_KEYS, "backup"),
                   lockstep=False, services=_PS_START,
                   summary="synchronous over the first n - b gradients of each step"),
    "mxnet-kvstore": Kind(f"{_NATIVE}:KVStoreAllreduce", framework="mxnet", device_buffer=True,
                          services=f"{_NATIVE}:start_kvstore",
                          summary="MXNet's ps-lite kvstore, dist_sync"),
    "mxnet-async": Kind(f"{_NATIVE}:KVStoreAsync", framework="mxnet", lockstep=False,
                        services=f"{_NATIVE}:start_kvstore", plain_sgd=True,
                        summary="MXNet's ps-lite kvstore, dist_async, SGD on its server"),
    "tensorflow-collective": Kind(f"{_NATIVE}:TensorFlowCollective", framework="tensorflow",
                                  services=f"{_NATIVE}:start_tensorflow_ports",
                                  prepare=f"{_NATIVE}:prepare_tensorflow",
                                  summary="TensorFlow's ring all-reduce "
                                  "(MultiWorkerMirroredStrategy)"),
    "tensorflow-ps": Kind("harness.loop.tensorflow_coordinator:train",
                          framework="tensorflow", keys=_PS_KEYS, lockstep=False,
                          plain_sgd=True, services=f"{_TF_PS}:start_services",
                          serves=f"{_TF_PS}:serve_worker",
                          summary="TensorFlow's ParameterServerStrategy: a coordinator hands "
                          "each step to whichever worker server is free, SGD on the ps"),
}
# How a parameter-server aggregator places the layers (the run's `placement`): tensors
# dealt round-robin over the servers (TensorFlow's default), contiguous shards balanced by
# bytes (the default), or the fully connected tail computed on a server (arXiv 1901.05803).
PLACEMENTS = ("data-parallel", "sharded", "fc-on-server")
SPEC_KEYS = ("staleness", "backup", "local_steps", "servers", "staleness_lr")
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


@dataclass(frozen=True)
class Context:
    """What an aggregator is built from, in one worker process."""

    run: Any  # RunSpec
    rank: int
    adapter: Any
    buffer: Any  # the torch communication buffer: gradient sums, loss sum last
    optimizer: Any  # harness.training.optim.Optimizer (the worker's)
    initial: Any  # the initial parameters, flat torch float32 in spec order
    run_dir: Any  # Path


def _load(target: str) -> Any:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def prepare(run: Any, rank: int) -> None:
    """What the run's aggregator must do in a worker before the adapter exists."""
    target = kind(run.aggregator.name).prepare
    if target is not None:
        _load(target)(run, rank)


def serve(run: Any, run_dir: Any, rank: int) -> None:
    """What a worker process of a coordinator-driven aggregator runs instead of the loop."""
    target = kind(run.aggregator.name).serves
    assert target is not None
    _load(target)(run, run_dir, rank)


def create(context: Context) -> Aggregator:
    return _load(kind(context.run.aggregator.name).target)(context)  # type: ignore[no-any-return]


def next_step(step: int, steps: int) -> int | None:
    """The step after `step` in a run of `steps` steps every worker takes (lockstep)."""
    return step + 1 if step + 1 < steps else None


def start_services(run: Any, free_port: Callable[[], int], logs: Path, run_dir: Path
                   ) -> Services:
    """The processes the run's aggregator needs beside the workers (none for most), started
    by its own starter (`Kind.services`); the launcher stops them."""
    target = kind(run.aggregator.name).services
    if target is None:
        return Services()
    module, attr = target.split(":")
    starter = getattr(importlib.import_module(module), attr)
    return starter(run, free_port, logs, run_dir)  # type: ignore[no-any-return]
