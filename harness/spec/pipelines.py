"""Pipelined virtual workers (HetPipe) in a suite: `virtual_workers` and `pipeline`, their
check against the workload and the rest of the run. The stage split and the allocation are
harness/partition/; the stages' loop is harness/loop/stage.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetbench.harness.partition.policies import fixed_policies, initial_sizes, measures
from hetbench.harness.partition.virtual import allocate
from hetbench.harness.spec.aggregators import AggregatorSpec
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import (
    MAX_MICRO_BATCHES,
    MAX_STEPS,
    At,
    check_keys,
    choice,
    int_list_of,
    integer,
    table,
)
from hetbench.harness.spec.frameworks import with_torch_layers
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.harness.spec.workers import WorkerSpec
from hetbench.workloads import WORKLOADS, get_workload
from hetbench.workloads.job import is_job

SCHEDULES = ("gpipe", "1f1b")


PROFILED = "profiled"


# How devices are grouped into virtual workers (HetPipe's policies, on a device list sorted
# fastest first): same-kind (NP: a node's devices, one kind per node), spread (ED: each
# virtual worker an equal share of every kind), hybrid (HD: half from a fast kind, half
# from a slow one, the fastest paired with the slowest). "given": ranks listed by hand.
ALLOCATIONS = ("same-kind", "spread", "hybrid")


@dataclass(frozen=True)
class PipelineSpec:
    virtual_workers: tuple[tuple[int, ...], ...]
    schedule: str = "gpipe"
    micro_batches: int = 4
    wave_bound: int = 0  # D: waves a virtual worker may run ahead of the slowest
    split: str | tuple[int, ...] = PROFILED  # or layers per stage, the same for every one
    profile_steps: int = 3  # timed passes per layer when the split is profiled
    allocation: str = "given"  # or one of ALLOCATIONS, which made virtual_workers

    def place(self, rank: int) -> tuple[int, int]:
        """(virtual worker, stage) of `rank`."""
        for index, ranks in enumerate(self.virtual_workers):
            if rank in ranks:
                return index, ranks.index(rank)
        raise ValueError(f"rank {rank} is in no virtual worker")

    def stages(self, virtual_worker: int) -> int:
        return len(self.virtual_workers[virtual_worker])

    def most_waves(self, steps: int) -> int:
        """The waves no stage goes past: under a wave bound (wsp) a faster virtual worker
        runs more than `steps`, the servers counting the run's progress."""
        return steps * (len(self.virtual_workers) if self.wave_bound else 1)


PIPELINE_KEYS = {"schedule", "micro_batches", "wave_bound", "split", "profile_steps"}


def batch_units(raw_groups: Any, workers: int) -> int:
    """How many parts the global batch is cut into: one per virtual worker (as far as the
    not yet checked key tells), else one per worker."""
    if isinstance(raw_groups, list) and raw_groups:
        return len(raw_groups)
    if isinstance(raw_groups, dict) and isinstance(raw_groups.get("size"), int) \
            and raw_groups["size"] > 0 and not isinstance(raw_groups["size"], bool):
        return max(workers // raw_groups["size"], 1)
    return workers


def parse_pipeline(values: dict[str, Any], workers: Sequence[WorkerSpec], global_batch: int,
              partition: PartitionSpec, aggregator: str, at: At) -> PipelineSpec | None:
    """`virtual_workers = [[0, 1], [2, 3]]` with `pipeline = { schedule = "1f1b",
    micro_batches = 4, wave_bound = 0, split = "profiled" | [layers per stage] }`."""
    raw_groups, raw = values["virtual_workers"], values["pipeline"]
    if raw_groups is None:
        if raw is not None:
            raise UsageError(at("pipeline"), "needs virtual_workers (the ranks of each "
                             "virtual worker, in stage order)")
        return None
    where = at("virtual_workers")
    n = len(workers)
    allocation = "given"
    if isinstance(raw_groups, dict):
        groups, allocation = allocated(raw_groups, workers, where)
    else:
        if (not isinstance(raw_groups, list) or not raw_groups
                or not all(isinstance(g, list) and g for g in raw_groups)):
            raise UsageError(where, "must be a list of non-empty lists of worker ranks, e.g. "
                             "[[0, 1], [2, 3]], or { allocation = ..., size = ... }")
        groups = tuple(tuple(integer(r, where, 0, n - 1) for r in g) for g in raw_groups)
    seen = sorted(r for g in groups for r in g)
    if seen != list(range(n)):
        raise UsageError(where, f"must name every worker rank 0 to {n - 1} exactly once, "
                         f"not {[list(g) for g in groups]}")
    raw = table({} if raw is None else raw, at("pipeline"))
    default = PipelineSpec  # the fields' defaults, written once there
    where = at("pipeline")
    check_keys(raw, PIPELINE_KEYS, where)
    schedule = choice(raw.get("schedule", default.schedule), SCHEDULES, f"{where}.schedule")
    micro = integer(raw.get("micro_batches", default.micro_batches), f"{where}.micro_batches",
                    minimum=1, maximum=MAX_MICRO_BATCHES)
    wave_bound = integer(raw.get("wave_bound", default.wave_bound), f"{where}.wave_bound",
                         minimum=0, maximum=MAX_STEPS)
    if wave_bound > 0 and len({len(g) for g in groups}) > 1:
        raise UsageError(f"{where}.wave_bound", f"{wave_bound} needs virtual workers of "
                         "equal size (one parameter server per stage); 0 runs with any")
    raw_split = raw.get("split", default.split)
    split: str | tuple[int, ...]
    if isinstance(raw_split, str):
        split = choice(raw_split, (PROFILED,), f"{where}.split")
    else:
        stages = {len(g) for g in groups}
        if len(stages) != 1:
            raise UsageError(f"{where}.split", "a list of layer counts needs virtual workers "
                             "of equal size; use 'profiled'")
        split = int_list_of(raw_split, f"{where}.split", stages.pop(), "one per stage")
    fixed = ", ".join(fixed_policies())
    if partition.adaptive:
        raise UsageError(at("partition.policy"), f"{partition.policy!r} does not run with "
                         f"virtual workers (allowed: {fixed})")
    if 0 in (partition.sizes or ()):
        raise UsageError(at("partition.sizes"), "every virtual worker needs a slice (at "
                         "least 1 each)")
    if measures(partition):
        raise UsageError(at("partition.policy"), f"{partition.policy!r} does not run with "
                         f"virtual workers (allowed: {fixed})")
    if aggregator != "torch":
        raise UsageError(at("aggregator"), f"{aggregator!r}: virtual workers exchange as "
                         "pipeline.wave_bound says (0: all-reduce; D > 0: a parameter server "
                         "per stage, scheme 'wsp'); leave aggregator unset")
    for index, samples in enumerate(vw_slices(partition, global_batch, len(groups))):
        if samples % micro:
            raise UsageError(f"{where}.micro_batches", f"{micro} does not divide virtual worker "
                             f"{index}'s slice of {samples} samples (micro-batches are equal)")
    return PipelineSpec(groups, schedule, micro, wave_bound, split,
                        integer(raw.get("profile_steps", default.profile_steps),
                                f"{where}.profile_steps", minimum=1, maximum=1000), allocation)


def allocated(raw: dict[str, Any], workers: Sequence[WorkerSpec], where: str
                ) -> tuple[tuple[tuple[int, ...], ...], str]:
    """`{ allocation = "same-kind" | "spread" | "hybrid", size = k }`: virtual workers of k
    devices each, grouped by HetPipe's policy (harness/partition/virtual.py)."""
    check_keys(raw, {"allocation", "size"}, where)
    policy = choice(raw.get("allocation", "spread"), ALLOCATIONS, f"{where}.allocation")
    if "size" not in raw:
        raise UsageError(f"{where}.size", "required: the devices (stages) of each virtual "
                         "worker")
    n = len(workers)
    size = integer(raw["size"], f"{where}.size", minimum=1, maximum=n)
    if n % size:
        raise UsageError(f"{where}.size", f"{size} does not divide the {n} workers")
    if policy == "hybrid" and size % 2:
        raise UsageError(f"{where}.size", f"{size}: 'hybrid' takes half of each virtual "
                         "worker from a fast kind and half from a slow one: an even size")
    return allocate(workers, policy, size), policy


def vw_slices(partition: PartitionSpec, global_batch: int, units: int) -> tuple[int, ...]:
    """The global batch's slice of each virtual worker (a fixed policy)."""
    return initial_sizes(partition, global_batch, units)


def check_pipeline(pipeline: PipelineSpec, workload: str, size: str,
                    values: dict[str, Any], at: At) -> None:
    """What the workload and the rest of the run allow of a pipeline. A job's layers are
    known once it is made: the job check (harness/run/jobcheck.py) counts them."""
    able = with_torch_layers()
    if values["framework"] not in able or any(
            isinstance(w, dict) and w.get("framework", values["framework"]) not in able
            for w in values.get("workers") or []):
        raise UsageError(at("framework"), "virtual workers run PyTorch stages "
                         f"(torch.distributed.pipelining) only: "
                         f"{' or '.join(repr(n) for n in able)}")
    if values["calibrate"]:
        raise UsageError(at("calibrate"), "does not run with virtual workers (a stage's "
                         "time is its micro-batches', not a slice's)")
    if values["loader"] and not is_job(workload):
        raise UsageError(at("loader"), "does not run with virtual workers of a built-in "
                         "workload (their stages read the batch in line); a workload named "
                         "by import path reads through torch's DataLoader there too")
    if values["instrument"] is False:
        raise UsageError(at("instrument"), "virtual workers always time their micro-"
                         "batches: true only")
    if is_job(workload):
        return
    spec = get_workload(workload)
    piped = sorted(name for name in WORKLOADS if get_workload(name).layers is not None)
    if spec.layers is None:
        raise UsageError(at("workload"), f"{workload!r} has no layer sequence to pipeline "
                         f"(allowed with virtual_workers: {', '.join(piped)})")
    check_layer_count(pipeline, spec.layers(size), f"{workload!r} at size {size!r}", at)


def check_layer_count(pipeline: PipelineSpec, layers: int, model: str, at: At) -> None:
    """A pipeline's stages and hand-given split against the model's layers."""
    longest = max(len(g) for g in pipeline.virtual_workers)
    if longest > layers:
        raise UsageError(at("virtual_workers"), f"{longest} stages exceed the {layers} layers "
                         f"of {model}")
    if isinstance(pipeline.split, tuple) and sum(pipeline.split) != layers:
        raise UsageError(at("pipeline") + ".split", f"{list(pipeline.split)} covers "
                         f"{sum(pipeline.split)} layers; {model} has {layers}")


def pipeline_from_dict(data: dict[str, Any] | None) -> PipelineSpec | None:
    if not data:
        return None
    split = data["split"]
    return PipelineSpec(**{**data, "virtual_workers": tuple(tuple(g) for g in
                                                            data["virtual_workers"]),
                           "split": split if isinstance(split, str) else tuple(split)})


def exchange_of(pipeline: PipelineSpec) -> AggregatorSpec | None:
    """The aggregator a pipeline's waves need: with wave bound D > 0, one parameter server
    per stage within D waves (wsp); with D = 0, the run's own all-reduce (None)."""
    if not pipeline.wave_bound:
        return None
    return AggregatorSpec("wsp", staleness=pipeline.wave_bound, servers=pipeline.stages(0))
