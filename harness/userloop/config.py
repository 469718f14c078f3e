"""What a user's own loop runs as, checked before anything starts: `hetbench.join`'s
arguments, this process's place in the job (torchrun's RANK, WORLD_SIZE, LOCAL_RANK) and
the workers `hetbench launch` describes (HETBENCH_WORKERS: a suite's worker tables, one per
rank). Every refusal names the call and the argument (UsageError). Imports no framework.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hetbench.harness.partition.policies import POLICIES
from hetbench.harness.spec import loops
from hetbench.harness.spec.aggregators import AggregatorSpec
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import MAX_STEPS, integer, number, valid_name
from hetbench.harness.spec.partitions import PartitionSpec, parse_partition
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.spec.workers import WorkerSpec, parse_workers

WORKERS_VARIABLE = "HETBENCH_WORKERS"  # JSON: a list of worker tables, one per rank
REDUCTIONS = ("mean", "sum")
JOIN = "hetbench.join"


@dataclass(frozen=True)
class Place:
    """This process in the job, as torchrun (or `hetbench launch`) says."""

    rank: int
    world_size: int
    local_rank: int


@dataclass(frozen=True)
class LoopConfig:
    """hetbench.join's arguments, checked."""

    global_batch: int
    loss_reduction: str
    partition: PartitionSpec
    suite: str
    run: str
    out: Path
    seed: int
    warmup_steps: int
    timeout_s: float
    counters_every: int


def place(environ: Mapping[str, str]) -> Place:
    """RANK, WORLD_SIZE and LOCAL_RANK; a script started alone is rank 0 of 1."""
    values = {}
    for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", None)):
        raw = environ.get(name)
        if raw is None:
            values[name] = default
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            raise UsageError(f"{JOIN}: {name}", f"{raw!r} is not a whole number (set by "
                             "torchrun)") from None
    rank, world = values["RANK"], values["WORLD_SIZE"]
    if world is None or world < 1 or rank is None or not 0 <= rank < world:
        raise UsageError(f"{JOIN}: RANK", f"{rank} is not a rank of WORLD_SIZE={world}")
    local = values["LOCAL_RANK"]
    return Place(rank, world, rank if local is None else local)


def parse(place: Place, global_batch: Any, loss_reduction: Any, partition: Any, suite: Any,
          run: Any, out: Any, seed: Any, warmup_steps: Any, timeout_s: Any,
          counters_every: Any) -> LoopConfig:
    """The arguments of `hetbench.join`, each refused with its name and what is allowed."""
    batch = integer(global_batch, f"{JOIN}(global_batch)", minimum=place.world_size,
                    maximum=10**9)
    reduction = checked_reduction(loss_reduction)
    policy = parse_partition(partition_table(partition), place.world_size, batch,
                             f"{JOIN}(partition)")
    if why := loops.loop_refusal(loops.EXCHANGE, False, False, policy):
        raise UsageError(f"{JOIN}(partition)", why)
    loops.check_profile_steps(policy, f"{JOIN}(partition)")
    script = script_path()
    return LoopConfig(
        global_batch=batch, loss_reduction=reduction, partition=policy,
        suite=valid_name(suite if suite is not None else name_of(script),
                         f"{JOIN}(suite)"),
        run=valid_name(run if run is not None else policy.policy, f"{JOIN}(run)"),
        out=Path(out) if isinstance(out, str | Path) else _refuse_out(out),
        seed=integer(seed, f"{JOIN}(seed)", minimum=0, maximum=2**31 - 1),
        warmup_steps=integer(warmup_steps, f"{JOIN}(warmup_steps)", minimum=0,
                             maximum=MAX_STEPS),
        timeout_s=number(timeout_s, f"{JOIN}(timeout_s)", minimum=0.0, maximum=86400.0,
                         strict=True),
        counters_every=integer(counters_every, f"{JOIN}(counters_every)", minimum=1,
                               maximum=MAX_STEPS))


def checked_reduction(loss_reduction: Any) -> str:
    if loss_reduction not in REDUCTIONS:
        declared = "not declared" if loss_reduction is None else f"{loss_reduction!r}"
        raise UsageError(f"{JOIN}(loss_reduction)", f"{declared}: say how your loss reduces "
                         "over a batch, 'mean' (torch's default) or 'sum', so that each "
                         "rank's gradient is weighted by its slice")
    return str(loss_reduction)


def launched_config(run: RunSpec, suite: str, out: Path, loss_reduction: Any) -> LoopConfig:
    """A launch's run as the session's configuration: everything the launch's, but the
    loss's reduction, which only the script knows."""
    return LoopConfig(global_batch=run.global_batch,
                      loss_reduction=checked_reduction(loss_reduction),
                      partition=run.partition, suite=suite, run=run.name, out=out,
                      seed=run.seed, warmup_steps=run.warmup_steps, timeout_s=run.timeout_s,
                      counters_every=run.counters_every)


def partition_table(raw: Any) -> Any:
    """A policy's name, a list of slice sizes, or a suite's partition table."""
    if isinstance(raw, str):
        if raw not in POLICIES:
            raise UsageError(f"{JOIN}(partition)", f"unknown policy {raw!r}: allowed: "
                             f"{', '.join(POLICIES)}, a list of slice sizes or a table")
        return {"policy": raw}
    if isinstance(raw, list | tuple):
        return {"policy": "sizes", "sizes": list(raw)}
    if isinstance(raw, Mapping):
        return dict(raw)
    raise UsageError(f"{JOIN}(partition)", f"a {type(raw).__name__}: give a policy's name "
                     f"({', '.join(POLICIES)}), a list of slice sizes or a table")


def _refuse_out(raw: Any) -> Path:
    raise UsageError(f"{JOIN}(out)", f"a {type(raw).__name__}: give a folder's path")


def script_path() -> Path:
    """The script the job runs (torchrun's, or python's, first argument)."""
    return Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else Path.cwd()


def name_of(script: Path) -> str:
    """A script's file name as a suite's name: its stem, with what a name may not hold
    made '-'."""
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in script.stem)
    return name.strip("-_") or "loop"


def launched_workers(place: Place, environ: Mapping[str, str]) -> tuple[WorkerSpec, ...] | None:
    """The workers `hetbench launch` describes (HETBENCH_WORKERS), one per rank; None where
    the variable is not set."""
    raw = environ.get(WORKERS_VARIABLE)
    if raw is None:
        return None
    try:
        tables = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(WORKERS_VARIABLE, f"not JSON ({exc.msg})") from None
    workers = parse_workers(tables, "pytorch", WORKERS_VARIABLE)
    if len(workers) != place.world_size:
        raise UsageError(WORKERS_VARIABLE, f"{len(workers)} workers for WORLD_SIZE="
                         f"{place.world_size}: one table per rank")
    for rank, worker in enumerate(workers):
        if worker.framework != "pytorch":
            raise UsageError(f"{WORKERS_VARIABLE}[{rank}].framework", "a user's loop is "
                             "PyTorch: allowed: 'pytorch'")
    return workers


def own_worker(place: Place, device: str | None, default_device: str, threads: int,
               launched: tuple[WorkerSpec, ...] | None) -> WorkerSpec:
    """This rank's worker: as launched, else its device (the argument, else cuda:LOCAL_RANK
    where torch sees that GPU, else cpu) and the threads torch uses."""
    if launched is not None:
        worker = launched[place.rank]
        if device is not None and device != worker.device:
            raise UsageError(f"{JOIN}(device)", f"{device!r}, but {WORKERS_VARIABLE} gives "
                             f"rank {place.rank} {worker.device!r}: leave device unset")
        return worker
    checked = parse_workers([{"device": device or default_device}], "pytorch",
                            f"{JOIN}(device)")[0]
    return replace(checked, threads=threads)


def loop_run(config: LoopConfig, workers: tuple[WorkerSpec, ...], steps: int, lr: float,
             ) -> RunSpec:
    """The RunSpec a user's loop records: its readers (report, simulate, advise) take it as
    any run's. Its exchange is an all-reduce of the weighted gradient sums in lockstep:
    the 'torch' aggregator's."""
    script = script_path()
    return RunSpec(
        name=config.run, framework="pytorch", workload=script.name, dataset=loops.LOOP_DATASET,
        steps=steps, warmup_steps=config.warmup_steps, global_batch=config.global_batch,
        lr=lr, seed=config.seed, partition=config.partition, workers=workers,
        timeout_s=config.timeout_s, counters_every=config.counters_every,
        keep_freed_memory=False,  # the script's allocator is its own
        aggregator=AggregatorSpec(name=loops.EXCHANGE), script=str(script),
        args=tuple(sys.argv[1:]))


def environment_device(place: Place, cuda_devices: int) -> str:
    """The default device of a rank: its local GPU where there is one, else the CPU."""
    return f"cuda:{place.local_rank}" if place.local_rank < cuda_devices else "cpu"

