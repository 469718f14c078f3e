"""A workload named by import path (`workload = "mypkg.models:make"`): what a suite may
ask of a user's job, checked without importing it. The job itself (the factory called, its
Job checked, its data collated) is checked before any run starts, in a process of its own
(harness/run/jobcheck.py): importing a user's model loads torch, which the CLI never does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetbench.harness.spec import aggregators
from hetbench.harness.spec.aggregators import AggregatorSpec
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import At, choice, integer, text
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.workloads.job import JobError, is_job, parse_reference

JOB_DATASET = "job"  # RunSpec.dataset of a job: the factory brings its data
JOB_METRIC = "accuracy"  # Job.metric's correct / counted
BATCHNORM = ("slice", "global")
# keys whose features need a built-in workload's insides (its layer cuts, its spec)
BUILTIN_ONLY = {
    "dataset": "the factory's Job brings its data (Job.train, Job.heldout)",
    "size": "the factory builds its model at the size it chooses",
}


def is_job_workload(raw: Any) -> bool:
    return isinstance(raw, str) and is_job(raw)


def parse_job(values: dict[str, Any], set_keys: set[str], framework: str, at: At) -> str:
    """The workload's reference, checked against the run's other keys (`set_keys`: those
    the suite gives, not defaults)."""
    where = at("workload")
    workload = text(values["workload"], where)
    try:
        parse_reference(workload)
    except JobError as exc:
        raise UsageError(where, str(exc)) from None
    if framework != "pytorch":
        raise UsageError(at("framework"), f"{framework!r} cannot run a workload named by "
                         "import path (a PyTorch job): allowed: 'pytorch'")
    for key, why in BUILTIN_ONLY.items():
        if key in set_keys and values.get(key) is not None:
            raise UsageError(at(key), f"not for a workload named by import path: {why}")
    return workload


def project_folder(raw: Any, suite_folder: Path, where: str) -> str:
    """The folder a job's import path resolves from: `project` (relative to the suite's
    folder), by default the suite's folder itself. Absolute, so that workers started
    elsewhere (another host's launcher, a ci worktree) resolve the same."""
    folder = suite_folder if raw is None else suite_folder / text(raw, where)
    folder = folder.resolve()
    if not folder.is_dir():
        raise UsageError(where, f"{folder} is not a folder (the project a workload named by "
                         "import path is imported from)")
    return str(folder)


def parse_batchnorm(values: dict[str, Any], partition: PartitionSpec,
                    aggregator: AggregatorSpec, at: At) -> str:
    """`batchnorm = "global"`: a job's BatchNorm layers take the global batch's statistics,
    each forward gathering every worker's sums. Every worker then computes in step with the
    others, so what times one worker alone, or leaves one out, cannot run with it (yet)."""
    mode = choice(values["batchnorm"], BATCHNORM, at("batchnorm"))
    if mode != "global":
        return mode
    if values.get("virtual_workers") is not None:
        raise UsageError(at("batchnorm"), "a pipeline's stages compute one micro-batch at a "
                         "time, so BatchNorm takes a micro-batch's statistics there: 'slice' "
                         "only with virtual_workers")
    if not aggregators.kind(aggregator.name).lockstep:
        lockstep = job_schemes(lambda k: k.lockstep)
        raise UsageError(at("aggregator"), f"{aggregator.name!r} lets workers step apart, "
                         "and batchnorm = 'global' meets every worker in every forward: "
                         f"allowed: {', '.join(lockstep)}")
    if partition.policy == "profiled":
        raise UsageError(at("partition.policy"), "'profiled' times each worker alone, which "
                         "batchnorm = 'global' cannot (every forward needs every worker): "
                         "allowed: equal, sizes, weights or an adaptive policy")
    if values["calibrate"] is True:
        raise UsageError(at("calibrate"), "calibration times each worker alone, which "
                         "batchnorm = 'global' cannot (every forward needs every worker)")
    if partition.may_leave_out:
        raise UsageError(at("partition"), "a worker left out computes no forward, which "
                         "batchnorm = 'global' needs of every worker: no empty slice, no "
                         "leave_out")
    return mode


MAX_ACCUMULATE = 1024


def parse_accumulate(values: dict[str, Any], aggregator: AggregatorSpec, batchnorm: str,
                     at: At) -> int:
    """`accumulate = k`: each worker's slice in k micro-batches, forward and backward over
    each in turn (the memory of one), their gradients summed before the step's exchange.
    The sum is the slice's gradient exactly where the model treats samples alone; BatchNorm
    then takes a micro-batch's statistics."""
    k = integer(values["accumulate"], at("accumulate"), minimum=1, maximum=MAX_ACCUMULATE)
    if k == 1:
        return k
    if aggregators.kind(aggregator.name).overlaps:
        raise UsageError(at("accumulate"), f"{aggregator.name!r} exchanges buckets during "
                         "the backward, each micro-batch's: accumulate = 1 with it (or an "
                         "aggregator that exchanges after the backward, 'torch')")
    if batchnorm == "global":
        raise UsageError(at("accumulate"), "batchnorm = 'global' takes the global batch's "
                         "statistics in one forward a step: accumulate = 1 with it")
    return k


def job_schemes(keep: Callable[[aggregators.Kind], bool]) -> list[str]:
    """The aggregators a job (PyTorch workers, no pipeline) may name that `keep` keeps."""
    return [n for n, k in aggregators.AGGREGATORS.items()
            if k.framework in (None, "pytorch") and not k.pipeline_only and keep(k)]


def own_optimizer_aggregators() -> list[str]:
    """The schemes a job's own optimizer (Job.optimizer) runs under: those whose exchange
    leaves every worker the global batch's gradient sums, stepped on each worker. Servers
    update on their side and local SGD keeps a copy it updates itself."""
    return job_schemes(lambda k: k.lockstep and k.services is None
                       and k.staleness_bound == "none")


def refuse_with_own_optimizer(aggregator: str, optimizer_set: bool, at: At) -> None:
    """A job that brings its optimizer, checked against the run (the job check learns
    whether it does: the suite check cannot import it). (A worker the policy leaves out
    and takes back receives the torch optimizer's state dict: harness/loop/membership.py.)"""
    if aggregator not in (allowed := own_optimizer_aggregators()):
        raise UsageError(at("aggregator"), f"the job's own optimizer (Job.optimizer) steps "
                         f"on the workers, which {aggregator!r} does not: allowed: "
                         f"{', '.join(allowed)}")
    if optimizer_set:
        raise UsageError(at("optimizer"), "the job brings its optimizer (Job.optimizer), "
                         "which replaces the suite's: remove `optimizer`")

