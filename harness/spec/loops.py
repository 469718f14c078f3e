"""A run whose steps a user's own script takes (`script = "train.py"`, `hetbench launch`):
what a suite may ask of it, checked without running it. The script calls `hetbench.join`
(harness/userloop/); hetbench starts one process of it per worker, as torchrun would, and
gives each its rank, its worker (device, threads, cores, emulated slowdown) and the run's
slices. Its model, data, optimizer and length are the script's, so the keys that describe
hetbench's own loop are refused; its exchange is Session.backward's all-reduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetbench.harness.spec.aggregators import AggregatorSpec
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import At, text
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.harness.spec.workers import WorkerSpec

# the run directory a script's worker records into, prepared by hetbench's launcher
RUN_DIR_VARIABLE = "HETBENCH_RUN_DIR"
LOOP_DATASET = "loop"  # RunSpec.dataset of a script's run: its data is the script's
EXCHANGE = "torch"  # Session.backward's exchange: the weighted sums all-reduced in lockstep
# keys that describe hetbench's own loop, and what takes their place in a script's run
SCRIPT_DECIDES = {
    "workload": "the script builds its model", "dataset": "the script reads its data",
    "size": "the script builds its model", "steps": "the script takes the steps it takes",
    "lr": "the script's optimizer has its own", "optimizer": "the script steps its own",
    "eval_every": "the script evaluates when it likes", "target": "needs eval_every",
    "loader": "the script's DataLoader is kept (its workers, prefetching, pinned memory)",
    "calibrate": "no worker of a script's run steps alone",
    "calibrate_steps": "no worker of a script's run steps alone",
    "instrument": "a script's steps are recorded by hetbench.join",
    "project": "the script is the project", "batchnorm": "the script builds its model",
    "virtual_workers": "every rank holds the whole model",
    "pipeline": "every rank holds the whole model",
    "placement": "its exchange is an all-reduce", "profile": "not for a script's run (yet)",
    "on_worker_failure": "a script's ranks fail together",
    "gc": "the script's collector is its own",
}


def parse_script(values: dict[str, Any], set_keys: set[str], folder: Path, at: At
                 ) -> tuple[str, tuple[str, ...]]:
    """The script (absolute, from the suite's folder) and its arguments, the run's other
    keys checked against what a script's run can be (`set_keys`: those the suite gives)."""
    where = at("script")
    script = (folder / text(values["script"], where)).resolve()
    if not script.is_file():
        raise UsageError(where, f"{script} is not a file (the script hetbench starts on "
                         "every worker, as torchrun would)")
    raw_args = values["args"]
    if not isinstance(raw_args, list | tuple) or not all(isinstance(a, str) for a in raw_args):
        raise UsageError(at("args"), "must be a list of strings (the script's arguments)")
    for key, why in SCRIPT_DECIDES.items():
        if key in set_keys:
            raise UsageError(at(key), f"not for a script's run: {why}")
    return str(script), tuple(raw_args)


def check_script_run(workers: tuple[WorkerSpec, ...], partition: PartitionSpec,
                     aggregator: AggregatorSpec, at: At) -> None:
    """What a script's run cannot be: another framework, its own loader workers, another
    exchange."""
    for i, worker in enumerate(workers):
        if worker.framework != "pytorch":
            raise UsageError(at(f"workers[{i}].framework"), "a script's run is PyTorch's "
                             "(hetbench.join): allowed: 'pytorch'")
        if worker.loader_workers is not None:
            raise UsageError(at(f"workers[{i}].loader_workers"), "the script's DataLoader "
                             "has its own workers")
    if why := loop_refusal(aggregator.name, False, False, partition):
        raise UsageError(at("aggregator" if aggregator.name != EXCHANGE else "partition"),
                         why)
    check_profile_steps(partition, at("partition"))


def loop_refusal(aggregator: str, pipeline: bool, placement: bool,
                 partition: PartitionSpec) -> str:
    """Why a user's own loop cannot run so ('' where it can). A rank left out (an empty
    slice) can: it still runs the loop's body, on a shadow slice weighted 0
    (harness/userloop/session.py)."""
    if aggregator != EXCHANGE:
        return (f"{aggregator!r}: a user's own loop exchanges its gradients by all-reduce "
                f"in Session.backward (allowed: {EXCHANGE!r})")
    if pipeline or placement:
        return "a user's own loop holds the whole model on every rank: no pipeline, no placement"
    return ""


def check_profile_steps(partition: PartitionSpec, where: str) -> None:
    """The profiled slices are timed in the job, the first step at a size left out: at
    least two steps a size."""
    if (partition.policy == "profiled" or (partition.adaptive
                                           and partition.initial == "profiled")) \
            and partition.profile_steps < 2:
        raise UsageError(f"{where}.profile_steps", f"{partition.profile_steps}: at least 2 "
                         "in a user's own loop (the slices are timed in the job, the first "
                         "step at a size left out)")
