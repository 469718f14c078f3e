"""Suite and run specs: TOML -> frozen dataclasses, with one-line errors that name the field.

A suite file looks like::

    [suite]
    name = "example"
    repeats = 1

    [defaults]            # optional: keys applied to every run unless the run sets them
    steps = 30

    [[runs]]
    name = "two-unequal"
    framework = "pytorch"
    workload = "mlp"
    dataset = "digits"
    global_batch = 128
    partition = { policy = "sizes", sizes = [32, 96] }
    workers = [ { device = "cpu", threads = 1 }, { device = "cpu", slowdown = 3.0 } ]

A string naming no file is looked up among the built-in suites (harness/spec/suites/*.toml).
"""

from __future__ import annotations

import fnmatch
import os
import re
import select
import stat
import time
import tomllib
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hetbench.harness.spec import aggregators, jobs, loops, pipelines
from hetbench.harness.spec.aggregators import AggregatorSpec
from hetbench.harness.spec.builtin import builtin_suites, builtin_text
from hetbench.harness.spec.errors import UsageError, listed
from hetbench.harness.spec.fields import (
    MAX_GLOBAL_BATCH,
    MAX_LR,
    MAX_REPEATS,
    MAX_SEED,
    MAX_STEPS,
    MAX_SUITE_BYTES,
    MAX_TARGET_LOSS,
    MAX_TIMEOUT_S,
    PIPE_TIMEOUT_S,
    At,
    boolean,
    check_keys,
    choice,
    integer,
    number,
    table,
    text,
    valid_name,
)
from hetbench.harness.spec.frameworks import FRAMEWORKS
from hetbench.harness.spec.loaders import LoaderSpec, parse_loader
from hetbench.harness.spec.nodes import NodeSpec, parse_nodes
from hetbench.harness.spec.optimizers import OptimizerSpec, parse_optimizer
from hetbench.harness.spec.partitions import PartitionSpec, parse_partition
from hetbench.harness.spec.pipelines import PipelineSpec, pipeline_from_dict
from hetbench.harness.spec.profiling import (
    ProfileSpec,
    parse_profile,
    profile_from_dict,
    step_window,
)
from hetbench.harness.spec.workers import WorkerSpec, parse_workers, worker_from_dict
from hetbench.harness.system.testbed import Link
from hetbench.workloads import DATASETS, WORKLOADS, get_workload
from hetbench.workloads.data import sample_count
from hetbench.workloads.models import DEFAULT_SIZE, SIZES


@dataclass(frozen=True)
class TargetSpec:
    """The held-out metric a run must reach: time to target is measured against it."""

    metric: str
    value: float

    @property
    def higher_is_better(self) -> bool:
        return self.metric != "loss"

    def reached(self, value: float) -> bool:
        return value >= self.value if self.higher_is_better else value <= self.value


IMPORTED_DATASET = "trace"  # RunSpec.dataset of a job imported from its profiler traces


STALL_MARGIN_S = 5.0  # beyond timeout_s, before a run without a step is stopped


@dataclass(frozen=True)
class RunSpec:
    name: str
    framework: str
    workload: str
    dataset: str
    steps: int
    warmup_steps: int
    global_batch: int
    lr: float
    seed: int
    partition: PartitionSpec
    workers: tuple[WorkerSpec, ...]
    timeout_s: float = 120.0
    instrument: bool = True
    calibrate: bool = False
    calibrate_steps: int = 10
    # all threads' kernel counts (CPU time, faults, switches, migrations, PMU) and getrusage
    # are read over one step in this many, the others record -1 there (the main thread's CPU
    # time and wait for a CPU are read at every step; harness/loop/counters.py: each read
    # costs 10-40 us inside a step here); 1: every step
    counters_every: int = 8
    # glibc keeps what a step frees (harness/system/allocator.py); false: glibc's defaults
    keep_freed_memory: bool = True
    # Python's cyclic collector over the steps (harness/loop/collection.py): "auto" as
    # Python runs it, "frozen" with what was built before the steps out of its scans, "off"
    gc: str = "auto"
    aggregator: AggregatorSpec = field(default_factory=AggregatorSpec)
    size: str = DEFAULT_SIZE
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    eval_every: int = 0  # 0: no held-out evaluation
    target: TargetSpec | None = None
    loader: LoaderSpec | None = None  # None: batches sliced in line, in the load phase
    on_worker_failure: str = "fail"  # "continue": the others go on without it (ps-async)
    # torchrun mode, across hosts: the network interface every listener binds (gloo,
    # TensorPipe, NCCL, ps-lite); None: each library's own choice. A local run binds lo.
    interface: str | None = None
    # virtual workers pipelining the model (HetPipe); None: every worker holds all of it
    pipeline: PipelineSpec | None = None
    # where a parameter-server aggregator puts the layers (PLACEMENTS); None: "sharded"
    placement: str | None = None
    # the trace (trace.json) holds the last this many steps, or the window (first, last) of
    # steps ("A-B" in a suite); 0: no trace. A long run's trace of every step would be more
    # than Perfetto's UI can hold (hetbench.harness.records.trace.MAX_ROWS bounds it too).
    trace_steps: int | tuple[int, int] = 5000
    # steps recorded by torch.profiler on some ranks (harness/spec/profiling.py); None: none
    profile: ProfileSpec | None = None
    # a workload named by import path: the folder it is imported from (absolute;
    # harness/spec/jobs.py); None for a built-in workload
    project: str | None = None
    # a job's BatchNorm layers: statistics of each worker's slice ("slice", as DDP takes
    # them), or of the global batch ("global": harness/training/batchnorm.py)
    batchnorm: str = "slice"
    # a job's micro-batches per slice: forward and backward over each in turn, their
    # gradients summed in the buffer before the one exchange (gradient accumulation)
    accumulate: int = 1
    # a user's own loop (hetbench.join, harness/userloop/): the script that ran it, absolute;
    # None for a run hetbench's own loop took
    script: str | None = None
    args: tuple[str, ...] = ()  # the script's arguments

    @property
    def is_job(self) -> bool:
        """The workload is a user's job named by import path (hetbench.workloads.job)."""
        return self.project is not None

    @property
    def is_imported(self) -> bool:
        """The run is a job's profiler traces, imported (hetbench import): nothing here can
        run it again."""
        return self.dataset == IMPORTED_DATASET

    @property
    def is_loop(self) -> bool:
        """The run is a user's own loop (hetbench.join): its script took the steps."""
        return self.script is not None

    @property
    def world_size(self) -> int:
        return len(self.workers)

    @property
    def heterogeneity(self) -> str:
        """'real' when device kinds differ, 'emulated' when only slowdown/threads/cores do."""
        if len({w.device.split(":")[0] for w in self.workers}) > 1:
            return "real"
        if any(w.emulated for w in self.workers):
            return "emulated"
        if len({(w.threads, w.cores) for w in self.workers}) > 1:
            return "emulated"
        return "homogeneous"

    def stall_limit_s(self, started: bool) -> float:
        """How long the run may go without a step flushed before the launcher stops it
        (harness/run/launcher.py), which is also how long a left-out worker waits for the
        members' word (harness/loop/membership.py). A worker that waits longer than
        timeout_s for a peer fails by itself, except where the wait has no timeout of its
        own (MXNet's ps-lite kvstore), which this bounds. Before the first step, start-up
        (imports, data, calibration, a first evaluation) gets more."""
        return self.timeout_s + STALL_MARGIN_S if started else 2 * self.timeout_s + 60

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    repeats: int
    runs: tuple[RunSpec, ...]
    source: str = ""
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    nodes: tuple[NodeSpec, ...] = ()  # [[nodes]]: each host's link, node 0 first

    def link(self, node: int) -> Link:
        """Node `node`'s link as the suite describes it (Link(): not described)."""
        return self.nodes[node].link if node < len(self.nodes) else Link()


# What a suite may leave out of a run: RunSpec's own defaults, plus the defaults of the keys
# that are read before they become fields (aggregator, optimizer, eval_every, the pipeline's
# keys, `strategy`) and of the fields a RunSpec needs (name, partition and workers aside).
RUN_DEFAULTS: dict[str, Any] = {
    **{f.name: f.default for f in fields(RunSpec) if f.default is not MISSING},
    "framework": "pytorch",
    "workload": "mlp",
    "dataset": None,  # the workload's default data set
    "steps": 30,
    "warmup_steps": 0,
    "global_batch": 128,
    "lr": 0.1,
    "seed": 0,
    "aggregator": None,  # "torch" unless `strategy` names one
    "strategy": None,  # the older key: an aggregator name
    "optimizer": "sgd",
    "eval_every": None,  # 0: no held-out evaluation
    "virtual_workers": None,
    "pipeline": None,
}
ON_WORKER_FAILURE = ("fail", "continue")
GC_MODES = ("auto", "frozen", "off")  # RunSpec.gc
RUN_KEYS = set(RUN_DEFAULTS) | {"name", "partition", "workers"}
SUITE_KEYS = {"name", "repeats", "description"}
TOP_KEYS = {"suite", "defaults", "runs", "nodes"}
TARGET_KEYS = {"metric", "value"}


@dataclass(frozen=True)
class Overrides:
    """What `hetbench run` changes of a suite for a quick study, applied before the suite is
    checked (so an override that breaks it, steps below warmup_steps, is refused as any
    suite value is)."""

    repeats: int | None = None
    steps: int | None = None
    runs: tuple[str, ...] | None = None  # only the runs whose name matches one (`picked`)
    # `hetbench launch CONFIG -- SCRIPT ARGS`: every run a script's run of SCRIPT (absolute)
    script: str | None = None
    script_args: tuple[str, ...] = ()


def load_suite(name_or_path: str, overrides: Overrides | None = None) -> SuiteSpec:
    """Read a suite from a TOML file or a built-in name; raise UsageError on anything wrong."""
    path = Path(name_or_path)
    # A file or a pipe is read (<(generate-suite) is a suite too); a device or socket is not.
    if _exists(path) and not path.is_dir():
        text, source = _read_text(path), str(path)
    elif name_or_path in builtin_suites():
        text = builtin_text(name_or_path)
        source = f"builtin:{name_or_path}"
    elif path.is_dir():
        raise UsageError(str(path), "is a directory, not a suite file (name a .toml file)")
    elif path.suffix == ".toml" or "/" in name_or_path:
        raise UsageError(str(path), "no such file")
    else:
        raise UsageError(
            "suite", f"{name_or_path!r} is neither a file nor a built-in suite "
            f"({', '.join(builtin_suites())})"
        )
    data = _parse_toml(text, source)
    if overrides is not None:
        data = _overridden(data, overrides)
    return parse_suite(data, source)


def name_matches(name: str, pattern: str) -> bool:
    """`-k`: a glob when the pattern has glob characters, else a substring."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def picked(names: Sequence[str], patterns: Sequence[str], where: str = "") -> list[str]:
    """The names (in their order) that match any of `-k`'s patterns; a pattern that
    matches none of them is refused by name (it was mistyped, or meant other runs)."""
    for pattern in patterns:
        if not any(name_matches(n, pattern) for n in names):
            raise UsageError("-k", f"no run{where} matches {pattern!r} (runs: "
                             f"{listed(list(dict.fromkeys(names)), 10)})")
    return [n for n in names if any(name_matches(n, p) for p in patterns)]


def _overridden(data: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    suite, runs = dict(data.get("suite", {})), data.get("runs")
    if not isinstance(suite, dict) or not isinstance(runs, list) or not all(
            isinstance(r, dict) for r in runs):
        return data  # malformed: parse_suite says how
    if overrides.repeats is not None:
        suite["repeats"] = overrides.repeats
    if overrides.runs is not None:
        kept = set(picked([str(r.get("name")) for r in runs], overrides.runs))
        runs = [r for r in runs if str(r.get("name")) in kept]
    if overrides.steps is not None:
        runs = [{**r, "steps": overrides.steps} for r in runs]
    if overrides.script is not None:
        defaults = data.get("defaults", {})
        for where, table_ in [("defaults", defaults if isinstance(defaults, dict) else {}),
                              *((f"runs[{i}]", r) for i, r in enumerate(runs))]:
            for key in ("script", "args"):
                if key in table_:
                    raise UsageError(f"{where}.{key}", "the command after `--` of hetbench "
                                     "launch gives the script and its arguments: remove it")
        runs = [{**r, "script": overrides.script, "args": list(overrides.script_args)}
                for r in runs]
    return {**data, "suite": suite, "runs": runs}


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
             (stat.S_ISSOCK, "socket"))
    return next((name for test, name in kinds if test(mode)), "special file")


def _read_pipe(path: Path, timeout_s: float) -> bytes:
    """A pipe's text, as `<(generate-suite)` gives it: opened without blocking (a named pipe
    nobody writes to would block open for good), read until its writer closes it, at most
    MAX_SUITE_BYTES + 1 and `timeout_s` seconds. A pipe with no writer reads as empty."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    size, deadline = 0, time.monotonic() + timeout_s
    try:
        while size <= MAX_SUITE_BYTES:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer, nothing written yet: wait for it
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise UsageError(str(path), "a pipe whose writer did not finish within "
                                                f"{timeout_s:g} s") from None
                continue
            if not chunk:  # end of file: the writer closed it, or there was none
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError as exc:  # e.g. a name too long for the file system
        raise UsageError(str(path), f"cannot read: {exc.strerror}") from None


def _read_text(path: Path) -> str:
    """The file as text: a huge, binary, non-UTF-8 or empty file is one line saying so, not
    a decoder's message or a TOML error at line 1. A device or socket is refused before it
    is opened; a pipe is read without blocking (_read_pipe)."""
    try:
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise UsageError(str(path), f"is a {_file_kind(mode)}, not a suite file (name a "
                                        ".toml file)")
        if stat.S_ISFIFO(mode):
            data = _read_pipe(path, PIPE_TIMEOUT_S)
        else:
            with path.open("rb") as file:
                data = file.read(MAX_SUITE_BYTES + 1)
    except OSError as exc:
        raise UsageError(str(path), f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_SUITE_BYTES:
        raise UsageError(str(path), f"is over {MAX_SUITE_BYTES >> 20} MiB: not a suite file")
    if not data.strip():
        raise UsageError(str(path), "is empty (a suite needs at least one [[runs]] table)")
    if b"\0" in data:
        raise UsageError(str(path), "cannot read: a binary file, not TOML text")
    try:
        return data.decode("utf-8-sig")  # TOML is UTF-8; some editors prepend a BOM
    except UnicodeDecodeError as exc:
        raise UsageError(str(path), f"cannot read: not UTF-8 text (byte "
                         f"0x{data[exc.start]:02x} at offset {exc.start})") from None


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(source, f"invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise UsageError(source, "invalid TOML: arrays or tables nested too deeply") from None
    except ValueError as exc:  # an integer longer than Python converts (4300 digits)
        raise UsageError(source, f"invalid TOML: {str(exc).split(';')[0]}") from None


def parse_suite(data: dict[str, Any], source: str = "") -> SuiteSpec:
    check_keys(data, TOP_KEYS, "")
    suite = table(data.get("suite", {}), "suite")
    check_keys(suite, SUITE_KEYS, "suite")
    name = _suite_name(suite, source)
    repeats = integer(suite.get("repeats", 1), "suite.repeats", minimum=1, maximum=MAX_REPEATS)
    description = text(suite.get("description", ""), "suite.description")
    defaults = table(data.get("defaults", {}), "defaults")
    check_keys(defaults, RUN_KEYS - {"name"}, "defaults")
    raw_runs = data.get("runs")
    if not isinstance(raw_runs, list) or not raw_runs:
        raise UsageError("runs", "at least one [[runs]] table is required")
    folder = _suite_folder(source)
    runs = tuple(
        parse_run(table(raw, f"runs[{i}]"), f"runs[{i}]", defaults, folder)
        for i, raw in enumerate(raw_runs)
    )
    seen: set[str] = set()
    for i, run in enumerate(runs):
        if run.name in seen:
            raise UsageError(f"runs[{i}].name", f"{run.name!r} is used twice; names are unique")
        seen.add(run.name)
    return SuiteSpec(name=name, repeats=repeats, runs=runs, source=source, description=description,
                     nodes=parse_nodes(data.get("nodes")))


def _suite_folder(source: str) -> Path:
    """Where a suite's relative paths start: its file's folder; for a built-in suite or a
    pipe, the working directory."""
    path = Path(source)
    return path.resolve().parent if source and path.is_file() else Path.cwd()


def _suite_name(suite: dict[str, Any], source: str) -> str:
    """[suite] name, or else the file's name, which may not be a valid one."""
    if "name" in suite:
        return valid_name(suite["name"], "suite.name")
    try:
        return valid_name(Path(source).stem or "suite", "suite.name")
    except UsageError as exc:
        raise UsageError(exc.where, f"{exc.message}; taken from the file name, as [suite] "
                         "sets no name") from None


def trace_window(value: Any, where: str) -> int | tuple[int, int]:
    """`trace_steps`: a count of steps (the last ones; 0: no trace) or a window "A-B"."""
    window = step_window(value, where, "or a count of the last steps (0: no trace)")
    if window is not None:
        return window
    return integer(value, where, minimum=0, maximum=MAX_STEPS)


def parse_run(raw: dict[str, Any], where: str, defaults: dict[str, Any] | None = None,
              folder: Path | None = None) -> RunSpec:
    """One [[runs]] table over the suite's [defaults]; errors name the table a value came
    from (runs[i].key, or defaults.key when the run does not set it). `folder`: where the
    suite's relative paths start (`project`; default: the working directory)."""
    check_keys(raw, RUN_KEYS, where)
    if "name" not in raw:
        raise UsageError(f"{where}.name", "required (letters, digits, '.', '_', '-')")
    defaults = defaults or {}
    values = {**RUN_DEFAULTS, **defaults, **raw}

    def at(key: str) -> str:
        return f"defaults.{key}" if key in defaults and key not in raw else f"{where}.{key}"

    framework = choice(values["framework"], FRAMEWORKS, at("framework"))
    global_batch = integer(values["global_batch"], at("global_batch"), minimum=1,
                           maximum=MAX_GLOBAL_BATCH)
    script_run = values["script"] is not None
    # a script's run takes the steps its script takes: 0 until it has ended
    steps = 0 if script_run else integer(values["steps"], at("steps"), minimum=1,
                                         maximum=MAX_STEPS)
    warmup = integer(values["warmup_steps"], at("warmup_steps"), minimum=0, maximum=MAX_STEPS)
    if warmup >= steps and not script_run:
        raise UsageError(at("warmup_steps"), f"{warmup} must be below steps ({steps})")
    workers = parse_workers(values.get("workers"), framework, at("workers"))
    if global_batch < len(workers):
        raise UsageError(
            at("global_batch"),
            f"{global_batch} is smaller than the number of workers ({len(workers)})",
        )
    # the global batch is sliced over virtual workers where they pipeline the model
    units = pipelines.batch_units(values["virtual_workers"], len(workers))
    partition = parse_partition(values.get("partition", {}), units, global_batch,
                                at("partition"))
    if partition.adaptive and values["instrument"] is False:
        raise UsageError(at("instrument"), f"policy {partition.policy!r} measures compute "
                         "times: instrument must be true")
    aggregator = aggregators.parse_aggregator(values, workers, at)
    aggregators.check_partition(aggregator, partition, at)
    on_failure = choice(values["on_worker_failure"], ON_WORKER_FAILURE, at("on_worker_failure"))
    aggregators.check_on_worker_failure(aggregator, on_failure, at)
    set_keys = set(raw) | set(defaults)
    if script_run:
        return _script_run(values, set_keys, folder or Path.cwd(), at, workers, partition,
                           aggregator, warmup, global_batch)
    if "args" in set_keys:
        raise UsageError(at("args"), "only with `script` (the arguments of a script's run)")
    job = jobs.is_job_workload(values["workload"])
    if job:
        workload = jobs.parse_job(values, set_keys, framework, at)
        dataset, metric, images = jobs.JOB_DATASET, jobs.JOB_METRIC, False
        project: str | None = jobs.project_folder(values["project"], folder or Path.cwd(),
                                                  at("project"))
        batchnorm = jobs.parse_batchnorm(values, partition, aggregator, at)
        accumulate = jobs.parse_accumulate(values, aggregator, batchnorm, at)
    else:
        workload = choice(values["workload"], WORKLOADS, at("workload"))
        spec = get_workload(workload)
        dataset = (spec.default_dataset if values["dataset"] is None
                   else choice(values["dataset"], DATASETS, at("dataset")))
        if dataset not in spec.datasets:
            raise UsageError(
                at("dataset"),
                f"{dataset!r} does not fit workload {workload!r} "
                f"(allowed: {', '.join(spec.datasets)})",
            )
        metric, images, project = spec.metric, spec.loss == "classify", None
        batchnorm, accumulate = RunSpec.batchnorm, RunSpec.accumulate
        for key in ("project", "batchnorm", "accumulate"):
            if key in set_keys:
                raise UsageError(at(key), "only for a workload named by import path "
                                 "('package.module:factory' or 'file.py:factory')")
    size = choice(values["size"], SIZES, at("size"))
    lr = number(values["lr"], at("lr"), minimum=0.0, maximum=MAX_LR, strict=True)
    optimizer = parse_optimizer(values["optimizer"], lr, steps, at("optimizer"))
    aggregators.check_optimizer(aggregator, optimizer == OptimizerSpec(), at)
    eval_every = 0
    if values["eval_every"] is not None:
        eval_every = integer(values["eval_every"], at("eval_every"), minimum=1, maximum=MAX_STEPS)
    target = _target(values["target"], metric, at("target"))
    if target is not None and not eval_every:
        raise UsageError(at("target"), "needs eval_every (the held-out metric is measured "
                         "every eval_every steps)")
    loader = parse_loader(values["loader"], images, at("loader"), job=job)
    for i, worker in enumerate(workers):
        if worker.loader_workers is not None and loader is None:
            raise UsageError(at(f"workers[{i}].loader_workers"), "sets the processes of the "
                             "run's input pipeline: the run needs a `loader` table")
    aggregators.check_coordinated(aggregator.name, partition, workload, loader, values, at)
    pipeline = pipelines.parse_pipeline(values, workers, global_batch, partition,
                                        aggregator.name, at)
    if pipeline is not None:
        pipelines.check_pipeline(pipeline, workload, size, values, at)
        aggregator = pipelines.exchange_of(pipeline) or aggregator
    else:
        aggregators.check_without_pipeline(aggregator, at)
    placement = aggregators.parse_placement(values, aggregator, workload, workers, at)
    if accumulate > 1 and (pipeline is not None or placement == "fc-on-server"):
        raise UsageError(at("accumulate"), "a pipeline's stages, or a last layer computed on "
                         "the server (fc-on-server), compute micro-batches of their own: "
                         "accumulate = 1 there")
    if not job and global_batch > (samples := sample_count(dataset, workload)):
        raise UsageError(at("global_batch"), f"{global_batch} exceeds the {samples} samples "
                         f"of dataset {dataset!r} (allowed: {len(workers)} to {samples})")
    return RunSpec(
        name=valid_name(values["name"], at("name")),
        framework=framework,
        workload=workload,
        dataset=dataset,
        steps=steps,
        warmup_steps=warmup,
        global_batch=global_batch,
        lr=lr,
        seed=integer(values["seed"], at("seed"), minimum=0, maximum=MAX_SEED),
        partition=partition,
        workers=workers,
        timeout_s=number(values["timeout_s"], at("timeout_s"), minimum=1.0,
                         maximum=MAX_TIMEOUT_S),
        instrument=boolean(values["instrument"], at("instrument")),
        keep_freed_memory=boolean(values["keep_freed_memory"], at("keep_freed_memory")),
        gc=choice(values["gc"], GC_MODES, at("gc")),
        calibrate=boolean(values["calibrate"], at("calibrate")),
        calibrate_steps=integer(values["calibrate_steps"], at("calibrate_steps"), minimum=1,
                                maximum=MAX_STEPS),
        counters_every=integer(values["counters_every"], at("counters_every"), minimum=1,
                               maximum=MAX_STEPS),
        trace_steps=trace_window(values["trace_steps"], at("trace_steps")),
        aggregator=aggregator,
        size=size,
        optimizer=optimizer,
        eval_every=eval_every,
        target=target,
        loader=loader,
        on_worker_failure=on_failure,
        interface=None if values["interface"] is None else _interface(values["interface"],
                                                                       at("interface")),
        pipeline=pipeline,
        placement=placement,
        profile=parse_profile(values["profile"], framework, steps, warmup, len(workers),
                              at("profile")),
        project=project,
        batchnorm=batchnorm,
        accumulate=accumulate,
    )


def _script_run(values: dict[str, Any], set_keys: set[str], folder: Path, at: At,
                workers: tuple[WorkerSpec, ...], partition: PartitionSpec,
                aggregator: AggregatorSpec, warmup: int, global_batch: int) -> RunSpec:
    """A run whose steps a user's script takes (harness/spec/loops.py)."""
    script, script_args = loops.parse_script(values, set_keys, folder, at)
    loops.check_script_run(workers, partition, aggregator, at)
    return RunSpec(
        name=valid_name(values["name"], at("name")), framework="pytorch",
        workload=Path(script).name, dataset=loops.LOOP_DATASET, steps=0, warmup_steps=warmup,
        global_batch=global_batch, lr=0.0, seed=integer(values["seed"], at("seed"), minimum=0,
                                                        maximum=MAX_SEED),
        partition=partition, workers=workers,
        timeout_s=number(values["timeout_s"], at("timeout_s"), minimum=1.0,
                         maximum=MAX_TIMEOUT_S),
        keep_freed_memory=False,  # the script's allocator is its own
        counters_every=integer(values["counters_every"], at("counters_every"), minimum=1,
                               maximum=MAX_STEPS),
        trace_steps=trace_window(values["trace_steps"], at("trace_steps")),
        aggregator=aggregator, script=script, args=script_args)


INTERFACE_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,15}")  # Linux: IFNAMSIZ, 16 with the NUL


def _interface(raw: Any, where: str) -> str:
    """A network interface's name (whether this host has it is asked where it is used)."""
    name = text(raw, where)
    if not INTERFACE_PATTERN.fullmatch(name):
        raise UsageError(where, f"{name!r} is not an interface name (1 to 15 letters, digits "
                         "and _.:-, as `ip link` lists them)")
    return name


def run_from_dict(data: dict[str, Any]) -> RunSpec:
    """The inverse of RunSpec.to_dict() (JSON turns tuples into lists)."""

    def tuples(d: dict[str, Any]) -> dict[str, Any]:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

    target = data.get("target")
    data = dict(data)
    strategy = data.pop("strategy", None)  # run.json written before aggregators
    aggregator = data.get("aggregator") or {"name": strategy or "torch"}
    if aggregator["name"] == "ddp":  # run.json written before the key: the timed hook
        aggregator = {"comm_hook": "timed", **aggregator}
    return RunSpec(**{
        **data,
        # run.json written before the key: its workers kept glibc's own thresholds
        "keep_freed_memory": data.get("keep_freed_memory", False),
        "aggregator": AggregatorSpec(**tuples(aggregator)),
        "partition": PartitionSpec(**tuples(data["partition"])),
        "workers": tuple(worker_from_dict(w) for w in data["workers"]),
        "optimizer": OptimizerSpec(**data.get("optimizer", {})),
        "target": TargetSpec(**target) if target else None,
        "loader": LoaderSpec(**data["loader"]) if data.get("loader") else None,
        "pipeline": pipeline_from_dict(data.get("pipeline")),
        "profile": profile_from_dict(data.get("profile")),
        "args": tuple(data.get("args", ())),
        "trace_steps": tuple(data["trace_steps"]) if isinstance(data.get("trace_steps"), list)
        else data.get("trace_steps", RunSpec.trace_steps),
    })


def _target(raw: Any, metric: str, where: str) -> TargetSpec | None:
    """`{ metric = "accuracy", value = 0.8 }`; the metric defaults to the workload's."""
    if raw is None:
        return None
    raw = table(raw, where)
    check_keys(raw, TARGET_KEYS, where)
    name = choice(raw.get("metric", metric), (metric, "loss"), f"{where}.metric")
    if "value" not in raw:
        raise UsageError(f"{where}.value", "required (the held-out value to reach)")
    value = number(raw["value"], f"{where}.value", minimum=0.0, maximum=MAX_TARGET_LOSS)
    if name != "loss" and value > 1.0:
        raise UsageError(f"{where}.value", f"{value} is not allowed ({name} is 0 to 1)")
    return TargetSpec(name, value)


# -- small typed readers: each names the field and what is allowed ---------------------------


