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
import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adapters import FRAMEWORKS
from harness.exchange import AGGREGATORS, PLACEMENTS, SPEC_KEYS, STALENESS_LR, AggregatorSpec
from harness.exchange import kind as aggregator_kind
from harness.exchange import problem as aggregator_problem
from harness.partition.policies import ADAPTIVE, POLICIES, equal_sizes, largest_remainder
from harness.partition.virtual import ALLOCATIONS, PROFILED, SCHEDULES, PipelineSpec, allocate
from harness.spec import emulation
from harness.spec.builtin import builtin_suites, builtin_text
from harness.spec.errors import UsageError
from harness.training.loader import KINDS, LoaderSpec
from harness.training.optim import DECAYS, OPTIMIZERS, OptimizerSpec
from workloads import DATASETS, WORKLOADS, get_workload
from workloads.models import DEFAULT_SIZE, SIZES

# Used with fullmatch: '$' alone would also accept a trailing newline.
# Suite and run names: the folders a run directory's path is made of.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
DEVICE_PATTERN = re.compile(r"cpu|cuda:\d+")


@dataclass(frozen=True)
class WorkerSpec:
    device: str = "cpu"
    threads: int = 1
    cores: tuple[int, ...] | None = None
    slowdown: float = 1.0
    framework: str = "pytorch"
    # Emulated heterogeneity that changes during the run: (step, factor) points, linear in
    # between, held before the first and after the last. Overrides `slowdown`.
    slowdown_at: tuple[tuple[int, float], ...] | None = None
    # Noisy per-step slowdowns on top: (probability, factor), e.g. OS interference; drawn
    # from (seed, rank, step), so every repeat and every scheme sees the same steps slowed.
    jitter: tuple[float, float] | None = None

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def emulated(self) -> bool:
        return self.slowdown != 1.0 or bool(self.slowdown_at) or bool(self.jitter)

    @property
    def varies(self) -> bool:
        """The slowdown changes from step to step (a schedule or jitter)."""
        return bool(self.slowdown_at) or bool(self.jitter)

    def factor_at(self, step: int, seed: int, rank: int) -> float:
        """The slowdown of this worker's step `step` (harness.spec.emulation)."""
        return emulation.factor_at(self, step, seed, rank)

    def slowdown_for(self, step: int) -> float:
        """The schedule's slowdown at `step`, without jitter (harness.spec.emulation)."""
        return emulation.scheduled(self, step)

    @property
    def label(self) -> str:
        """How the records and figures name this worker."""
        label = f"{self.framework} {self.device} x{self.threads}"
        if self.cores:
            label += f" cores {','.join(map(str, self.cores))}"
        if self.slowdown_at:
            label += " slowdown " + ",".join(f"{f:g}@{s}" for s, f in self.slowdown_at)
        elif self.slowdown != 1.0:
            label += f" slowdown {self.slowdown:g}"
        if self.jitter:
            label += f" jitter {self.jitter[1]:g}x p{self.jitter[0]:g}"
        return label


@dataclass(frozen=True)
class PartitionSpec:
    policy: str = "equal"
    sizes: tuple[int, ...] | None = None
    weights: tuple[float, ...] | None = None
    profile_steps: int = 5
    # adaptive policies (proportional, model): see harness.partition.policies.Damping
    initial: str = "equal"
    every: int = 10
    dead_band: float = 0.05
    max_move: float = 0.25
    min_slice: int = 1
    smoothing: float = 0.5
    max_ratio: float = 2.0
    reset: float = 0.3
    # 'model' only: a worker whose slice does not pay for its cost and the exchange gets
    # none (harness.partition.policies.Repartitioner.membership)
    leave_out: bool = False

    @property
    def adaptive(self) -> bool:
        return self.policy in ADAPTIVE

    @property
    def may_leave_out(self) -> bool:
        """Some worker may compute nothing: an empty slice given, or decided at run time."""
        return self.leave_out or 0 in (self.sizes or ())


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


RUN_DEFAULTS: dict[str, Any] = {
    "framework": "pytorch",
    "workload": "mlp",
    "dataset": None,  # the workload's default data set
    "steps": 30,
    "warmup_steps": 0,
    "global_batch": 128,
    "lr": 0.1,
    "seed": 0,
    "timeout_s": 120.0,
    "instrument": True,
    "calibrate": False,
    "calibrate_steps": 10,
    "aggregator": None,  # "torch" unless `strategy` names one
    "strategy": None,  # the older key: an aggregator name
    "size": DEFAULT_SIZE,
    "optimizer": "sgd",
    "eval_every": None,
    "target": None,
    "loader": None,
    "on_worker_failure": "fail",
    "interface": None,
    "virtual_workers": None,
    "pipeline": None,
    "placement": None,
}
ON_WORKER_FAILURE = ("fail", "continue")
RUN_KEYS = set(RUN_DEFAULTS) | {"name", "partition", "workers"}
SUITE_KEYS = {"name", "repeats", "description"}
TOP_KEYS = {"suite", "defaults", "runs"}
WORKER_KEYS = {"device", "threads", "cores", "slowdown", "slowdown_at", "jitter", "framework"}
ADAPTIVE_KEYS = {"initial", "every", "dead_band", "max_move", "min_slice", "smoothing",
                 "max_ratio", "reset", "leave_out"}
# the aggregators whose exchange can leave a worker out (an all-reduce among the others)
MEMBERSHIP_AGGREGATORS = ("torch", "allreduce-host")
PARTITION_KEYS = {"policy", "sizes", "weights", "profile_steps"} | ADAPTIVE_KEYS
# optimizer key -> the optimizers it applies to
OPTIMIZER_KEYS = {"name": OPTIMIZERS, "weight_decay": OPTIMIZERS, "warmup_steps": OPTIMIZERS,
                  "decay": OPTIMIZERS, "min_lr": OPTIMIZERS, "momentum": ("momentum",),
                  "nesterov": ("momentum",), "beta1": ("adamw",), "beta2": ("adamw",),
                  "eps": ("adamw",)}
TARGET_KEYS = {"metric", "value"}
PIPELINE_KEYS = {"schedule", "micro_batches", "wave_bound", "split", "profile_steps"}
MAX_MICRO_BATCHES = 4096
LOADER_KEYS = {"workers", "prefetch", "kind", "decode", "augment"}
MAX_LOADER_WORKERS = 32
MAX_PREFETCH = 256
MAX_SUITE_BYTES = 1 << 24  # suites are kilobytes; this stops a read of /dev/zero or a disk image
# Upper bounds: generous, but a typo (an extra zero or ten) is refused before anything runs
# instead of a run that never ends, a fork bomb or an overflow deep inside a worker.
MAX_NAME_LENGTH = 100  # run folders are NAME-rREPEAT-TIMESTAMP: well under 255 bytes
MAX_REPEATS = 1000
MAX_STEPS = 10_000_000  # every count of steps: steps, warm-ups, intervals, staleness
MAX_TIMEOUT_S = 86_400.0  # a day
MAX_GLOBAL_BATCH = 1_000_000  # the data set's own size is checked too
MAX_WORKERS = 1024
MAX_THREADS = 1024
MAX_CORE = 8191  # Linux numbers at most 8192 CPUs (NR_CPUS)
MAX_SERVERS = 64
MAX_SLOWDOWN = 1e6  # slowdown, slowdown_at and jitter factors (large ones emulate a stall)
MAX_LR = 100.0
MAX_SEED = 2**32 - 1  # what every framework's and numpy's seeding accepts
MAX_WEIGHT = 1e6  # partition weights are relative: a ratio beyond this is a typo
MAX_TOLERANCE = 100.0  # dead_band and reset, relative thresholds (100 = 10,000 %)
MAX_SLICE_RATIO = 1000.0
MAX_EPS = 1.0
MAX_WEIGHT_DECAY = 1.0
MAX_TARGET_LOSS = 1e6


@dataclass(frozen=True)
class Overrides:
    """What `hetbench run` changes of a suite for a quick study, applied before the suite is
    checked (so an override that breaks it, steps below warmup_steps, is refused as any
    suite value is)."""

    repeats: int | None = None
    steps: int | None = None
    runs: str | None = None  # only the runs whose name matches (a glob, else a substring)


def load_suite(name_or_path: str, overrides: Overrides | None = None) -> SuiteSpec:
    """Read a suite from a TOML file or a built-in name; raise UsageError on anything wrong."""
    path = Path(name_or_path)
    # Anything but a directory is read: a pipe such as <(generate-suite) is a suite too.
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


def _overridden(data: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    suite, runs = dict(data.get("suite", {})), data.get("runs")
    if not isinstance(suite, dict) or not isinstance(runs, list) or not all(
            isinstance(r, dict) for r in runs):
        return data  # malformed: parse_suite says how
    if overrides.repeats is not None:
        suite["repeats"] = overrides.repeats
    if overrides.runs is not None:
        pattern = overrides.runs
        kept = [r for r in runs if name_matches(str(r.get("name")), pattern)]
        if not kept:
            names = ", ".join(str(r.get("name")) for r in runs)
            raise UsageError("-k", f"no run matches {pattern!r} (runs: {names})")
        runs = kept
    if overrides.steps is not None:
        runs = [{**r, "steps": overrides.steps} for r in runs]
    return {**data, "suite": suite, "runs": runs}


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError as exc:  # e.g. a name too long for the file system
        raise UsageError(str(path), f"cannot read: {exc.strerror}") from None


def _read_text(path: Path) -> str:
    """The file as text: a huge, binary, non-UTF-8 or empty file is one line saying so, not
    a decoder's message or a TOML error at line 1."""
    try:
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
    _check_keys(data, TOP_KEYS, "")
    suite = _table(data.get("suite", {}), "suite")
    _check_keys(suite, SUITE_KEYS, "suite")
    name = _suite_name(suite, source)
    repeats = _int(suite.get("repeats", 1), "suite.repeats", minimum=1, maximum=MAX_REPEATS)
    description = _str(suite.get("description", ""), "suite.description")
    defaults = _table(data.get("defaults", {}), "defaults")
    _check_keys(defaults, RUN_KEYS - {"name"}, "defaults")
    raw_runs = data.get("runs")
    if not isinstance(raw_runs, list) or not raw_runs:
        raise UsageError("runs", "at least one [[runs]] table is required")
    runs = tuple(
        parse_run(_table(raw, f"runs[{i}]"), f"runs[{i}]", defaults)
        for i, raw in enumerate(raw_runs)
    )
    seen: set[str] = set()
    for i, run in enumerate(runs):
        if run.name in seen:
            raise UsageError(f"runs[{i}].name", f"{run.name!r} is used twice; names are unique")
        seen.add(run.name)
    return SuiteSpec(name=name, repeats=repeats, runs=runs, source=source, description=description)


def _suite_name(suite: dict[str, Any], source: str) -> str:
    """[suite] name, or else the file's name, which may not be a valid one."""
    if "name" in suite:
        return _name(suite["name"], "suite.name")
    try:
        return _name(Path(source).stem or "suite", "suite.name")
    except UsageError as exc:
        raise UsageError(exc.where, f"{exc.message}; taken from the file name, as [suite] "
                         "sets no name") from None


def parse_run(raw: dict[str, Any], where: str, defaults: dict[str, Any] | None = None
              ) -> RunSpec:
    """One [[runs]] table over the suite's [defaults]; errors name the table a value came
    from (runs[i].key, or defaults.key when the run does not set it)."""
    _check_keys(raw, RUN_KEYS, where)
    if "name" not in raw:
        raise UsageError(f"{where}.name", "required (letters, digits, '.', '_', '-')")
    defaults = defaults or {}
    values = {**RUN_DEFAULTS, **defaults, **raw}

    def at(key: str) -> str:
        return f"defaults.{key}" if key in defaults and key not in raw else f"{where}.{key}"

    framework = _choice(values["framework"], FRAMEWORKS, at("framework"))
    global_batch = _int(values["global_batch"], at("global_batch"), minimum=1,
                        maximum=MAX_GLOBAL_BATCH)
    steps = _int(values["steps"], at("steps"), minimum=1, maximum=MAX_STEPS)
    warmup = _int(values["warmup_steps"], at("warmup_steps"), minimum=0, maximum=MAX_STEPS)
    if warmup >= steps:
        raise UsageError(at("warmup_steps"), f"{warmup} must be below steps ({steps})")
    workers = _workers(values.get("workers"), framework, at("workers"))
    if global_batch < len(workers):
        raise UsageError(
            at("global_batch"),
            f"{global_batch} is smaller than the number of workers ({len(workers)})",
        )
    # the global batch is sliced over virtual workers where they pipeline the model
    units = _units(values["virtual_workers"], len(workers))
    partition = _partition(values.get("partition", {}), units, global_batch, at("partition"))
    if partition.adaptive and values["instrument"] is False:
        raise UsageError(at("instrument"), f"policy {partition.policy!r} measures compute "
                         "times: instrument must be true")
    aggregator = _aggregator(values, workers, at)
    if partition.adaptive and not aggregator_kind(aggregator.name).lockstep:
        raise UsageError(at("partition.policy"), f"{partition.policy!r} repartitions every "
                         f"worker at the same steps: it needs a lockstep aggregator, not "
                         f"{aggregator.name!r}")
    if partition.may_leave_out and aggregator.name not in MEMBERSHIP_AGGREGATORS:
        what = "leave_out" if partition.leave_out else "sizes"
        raise UsageError(at(f"partition.{what}"), "a worker left out (an empty slice) needs "
                         f"an all-reduce aggregator ({', '.join(MEMBERSHIP_AGGREGATORS)}), "
                         f"not {aggregator.name!r}")
    on_failure = _choice(values["on_worker_failure"], ON_WORKER_FAILURE, at("on_worker_failure"))
    if on_failure == "continue" and aggregator.name != "ps-async":
        raise UsageError(at("on_worker_failure"), "'continue' needs aggregator 'ps-async' "
                         f"(the one scheme that waits for no other worker), not "
                         f"{aggregator.name!r}")
    workload = _choice(values["workload"], WORKLOADS, at("workload"))
    spec = get_workload(workload)
    dataset = (spec.default_dataset if values["dataset"] is None
               else _choice(values["dataset"], DATASETS, at("dataset")))
    if dataset not in spec.datasets:
        raise UsageError(
            at("dataset"),
            f"{dataset!r} does not fit workload {workload!r} "
            f"(allowed: {', '.join(spec.datasets)})",
        )
    size = _choice(values["size"], SIZES, at("size"))
    lr = _float(values["lr"], at("lr"), minimum=0.0, maximum=MAX_LR, strict=True)
    optimizer = _optimizer(values["optimizer"], lr, steps, at("optimizer"))
    if aggregator_kind(aggregator.name).plain_sgd and optimizer != OptimizerSpec():
        raise UsageError(at("optimizer"), f"{aggregator.name!r} runs its framework's own "
                         "SGD on the server: plain 'sgd' only, no weight decay or schedule")
    eval_every = 0
    if values["eval_every"] is not None:
        eval_every = _int(values["eval_every"], at("eval_every"), minimum=1, maximum=MAX_STEPS)
    target = _target(values["target"], spec.metric, at("target"))
    if target is not None and not eval_every:
        raise UsageError(at("target"), "needs eval_every (the held-out metric is measured "
                         "every eval_every steps)")
    loader = _loader(values["loader"], spec.loss == "classify", at("loader"))
    if aggregator_kind(aggregator.name).serves is not None:
        _check_coordinated(aggregator.name, partition, workload, loader, values, at)
    pipeline = _pipeline(values, workers, global_batch, partition, aggregator.name, at)
    if pipeline is not None:
        _check_pipeline(pipeline, workload, size, values, at)
        if pipeline.wave_bound:
            aggregator = AggregatorSpec("wsp", staleness=pipeline.wave_bound,
                                        servers=pipeline.stages(0))
    elif aggregator.name == "wsp":
        raise UsageError(at("aggregator"), "'wsp' is what virtual_workers with "
                         "pipeline.wave_bound > 0 run; it takes no aggregator key")
    placement = _placement(values, aggregator, workload, size, workers, at)
    from workloads.data import sample_count  # numpy, no framework

    if global_batch > (samples := sample_count(dataset, workload)):
        raise UsageError(at("global_batch"), f"{global_batch} exceeds the {samples} samples "
                         f"of dataset {dataset!r} (allowed: {len(workers)} to {samples})")
    return RunSpec(
        name=_name(values["name"], at("name")),
        framework=framework,
        workload=workload,
        dataset=dataset,
        steps=steps,
        warmup_steps=warmup,
        global_batch=global_batch,
        lr=lr,
        seed=_int(values["seed"], at("seed"), minimum=0, maximum=MAX_SEED),
        partition=partition,
        workers=workers,
        timeout_s=_float(values["timeout_s"], at("timeout_s"), minimum=1.0,
                         maximum=MAX_TIMEOUT_S),
        instrument=_bool(values["instrument"], at("instrument")),
        calibrate=_bool(values["calibrate"], at("calibrate")),
        calibrate_steps=_int(values["calibrate_steps"], at("calibrate_steps"), minimum=1,
                             maximum=MAX_STEPS),
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
    )


def _check_coordinated(name: str, partition: PartitionSpec, workload: str,
                       loader: LoaderSpec | None, values: dict[str, Any], at: Any) -> None:
    """A coordinator-driven aggregator (tensorflow-ps) runs no hetbench loop in the workers:
    what that loop does (measure to partition or calibrate, load, transform, run bare) it
    cannot."""
    fixed = ("equal", "sizes", "weights")
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


def _placement(values: dict[str, Any], aggregator: AggregatorSpec, workload: str, size: str,
               workers: Sequence[WorkerSpec], at: Any) -> str | None:
    """`placement = "data-parallel" | "sharded" | "fc-on-server"`: how a parameter-server
    aggregator places the layers (harness/exchange/parameter_server.py)."""
    raw = values["placement"]
    if raw is None:
        return None
    where = at("placement")
    placement = _choice(raw, PLACEMENTS, where)
    kind = aggregator_kind(aggregator.name)
    if not kind.servers or aggregator.name == "wsp" or kind.serves is not None:
        raise UsageError(where, f"places layers on parameter servers: it needs aggregator "
                         f"ps-sync, ps-async, ssp or backup, not {aggregator.name!r}")
    if placement == "fc-on-server":
        if aggregator.name != "ps-sync":
            raise UsageError(where, "'fc-on-server' updates the server's layers once per "
                             f"step from every worker: aggregator 'ps-sync', not "
                             f"{aggregator.name!r}")
        if get_workload(workload).fc_layers is None:
            placed = sorted(n for n in WORKLOADS if get_workload(n).fc_layers is not None)
            raise UsageError(where, f"{workload!r} has no convolutional layers to keep on "
                             f"the workers (allowed: {', '.join(placed)})")
        if any(w.framework != "pytorch" for w in workers):
            raise UsageError(where, "'fc-on-server' runs the workers' layers in PyTorch: "
                             "every worker on framework 'pytorch'")
    return placement


def _units(raw_groups: Any, workers: int) -> int:
    """How many parts the global batch is cut into: one per virtual worker (as far as the
    not yet checked key tells), else one per worker."""
    if isinstance(raw_groups, list) and raw_groups:
        return len(raw_groups)
    if isinstance(raw_groups, dict) and isinstance(raw_groups.get("size"), int) \
            and raw_groups["size"] > 0 and not isinstance(raw_groups["size"], bool):
        return max(workers // raw_groups["size"], 1)
    return workers


def _pipeline(values: dict[str, Any], workers: Sequence[WorkerSpec], global_batch: int,
              partition: PartitionSpec, aggregator: str, at: Any) -> PipelineSpec | None:
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
        groups, allocation = _allocation(raw_groups, workers, where)
    else:
        if (not isinstance(raw_groups, list) or not raw_groups
                or not all(isinstance(g, list) and g for g in raw_groups)):
            raise UsageError(where, "must be a list of non-empty lists of worker ranks, e.g. "
                             "[[0, 1], [2, 3]], or { allocation = ..., size = ... }")
        groups = tuple(tuple(_int(r, where, 0, n - 1) for r in g) for g in raw_groups)
    seen = sorted(r for g in groups for r in g)
    if seen != list(range(n)):
        raise UsageError(where, f"must name every worker rank 0 to {n - 1} exactly once, "
                         f"not {[list(g) for g in groups]}")
    raw = _table({} if raw is None else raw, at("pipeline"))
    where = at("pipeline")
    _check_keys(raw, PIPELINE_KEYS, where)
    schedule = _choice(raw.get("schedule", "gpipe"), SCHEDULES, f"{where}.schedule")
    micro = _int(raw.get("micro_batches", 4), f"{where}.micro_batches", minimum=1,
                 maximum=MAX_MICRO_BATCHES)
    wave_bound = _int(raw.get("wave_bound", 0), f"{where}.wave_bound", minimum=0,
                      maximum=MAX_STEPS)
    if wave_bound > 0 and len({len(g) for g in groups}) > 1:
        raise UsageError(f"{where}.wave_bound", f"{wave_bound} needs virtual workers of "
                         "equal size (one parameter server per stage); 0 runs with any")
    raw_split = raw.get("split", PROFILED)
    split: str | tuple[int, ...]
    if isinstance(raw_split, str):
        split = _choice(raw_split, (PROFILED,), f"{where}.split")
    else:
        stages = {len(g) for g in groups}
        if len(stages) != 1:
            raise UsageError(f"{where}.split", "a list of layer counts needs virtual workers "
                             "of equal size; use 'profiled'")
        split = _int_list_of(raw_split, f"{where}.split", stages.pop(), "one per stage")
    if partition.adaptive:
        raise UsageError(at("partition.policy"), f"{partition.policy!r} does not run with "
                         "virtual workers (allowed: equal, sizes, weights)")
    if 0 in (partition.sizes or ()):
        raise UsageError(at("partition.sizes"), "every virtual worker needs a slice (at "
                         "least 1 each)")
    if partition.policy == "profiled":
        raise UsageError(at("partition.policy"), "'profiled' does not run with virtual "
                         "workers (allowed: equal, sizes, weights)")
    if aggregator != "torch":
        raise UsageError(at("aggregator"), f"{aggregator!r}: virtual workers exchange as "
                         "pipeline.wave_bound says (0: all-reduce; D > 0: a parameter server "
                         "per stage, scheme 'wsp'); leave aggregator unset")
    for index, samples in enumerate(vw_slices(partition, global_batch, len(groups))):
        if samples % micro:
            raise UsageError(f"{where}.micro_batches", f"{micro} does not divide virtual worker "
                             f"{index}'s slice of {samples} samples (micro-batches are equal)")
    return PipelineSpec(groups, schedule, micro, wave_bound, split,
                        _int(raw.get("profile_steps", 3), f"{where}.profile_steps",
                             minimum=1, maximum=1000), allocation)


def _allocation(raw: dict[str, Any], workers: Sequence[WorkerSpec], where: str
                ) -> tuple[tuple[tuple[int, ...], ...], str]:
    """`{ allocation = "same-kind" | "spread" | "hybrid", size = k }`: virtual workers of k
    devices each, grouped by HetPipe's policy (harness/partition/virtual.py)."""
    _check_keys(raw, {"allocation", "size"}, where)
    policy = _choice(raw.get("allocation", "spread"), ALLOCATIONS, f"{where}.allocation")
    if "size" not in raw:
        raise UsageError(f"{where}.size", "required: the devices (stages) of each virtual "
                         "worker")
    n = len(workers)
    size = _int(raw["size"], f"{where}.size", minimum=1, maximum=n)
    if n % size:
        raise UsageError(f"{where}.size", f"{size} does not divide the {n} workers")
    if policy == "hybrid" and size % 2:
        raise UsageError(f"{where}.size", f"{size}: 'hybrid' takes half of each virtual "
                         "worker from a fast kind and half from a slow one: an even size")
    return allocate(workers, policy, size), policy


def vw_slices(partition: PartitionSpec, global_batch: int, units: int) -> tuple[int, ...]:
    """The global batch's slice of each virtual worker (a static policy)."""
    if partition.policy == "sizes":
        return tuple(partition.sizes or ())
    if partition.policy == "weights":
        return largest_remainder(global_batch, partition.weights or ())
    return equal_sizes(global_batch, units)


def _check_pipeline(pipeline: PipelineSpec, workload: str, size: str,
                    values: dict[str, Any], at: Any) -> None:
    """What the workload and the rest of the run allow of a pipeline."""
    spec = get_workload(workload)
    piped = sorted(name for name in WORKLOADS if get_workload(name).layers is not None)
    if spec.layers is None:
        raise UsageError(at("workload"), f"{workload!r} has no layer sequence to pipeline "
                         f"(allowed with virtual_workers: {', '.join(piped)})")
    if values["framework"] != "pytorch" or any(
            isinstance(w, dict) and w.get("framework", "pytorch") != "pytorch"
            for w in values.get("workers") or []):
        raise UsageError(at("framework"), "virtual workers run PyTorch stages "
                         "(torch.distributed.pipelining) only: 'pytorch'")
    layers = spec.layers(size)
    longest = max(len(g) for g in pipeline.virtual_workers)
    if longest > layers:
        raise UsageError(at("virtual_workers"), f"{longest} stages exceed the {layers} layers "
                         f"of {workload!r} at size {size!r}")
    if isinstance(pipeline.split, tuple) and sum(pipeline.split) != layers:
        raise UsageError(at("pipeline") + ".split", f"{list(pipeline.split)} covers "
                         f"{sum(pipeline.split)} layers; {workload!r} at size {size!r} has "
                         f"{layers}")
    for key in ("loader", "calibrate"):
        if values[key]:
            raise UsageError(at(key), "does not run with virtual workers (their stages "
                             "read the batch themselves)")
    if values["instrument"] is False:
        raise UsageError(at("instrument"), "virtual workers always time their micro-"
                         "batches: true only")


INTERFACE_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,15}")  # Linux: IFNAMSIZ, 16 with the NUL


def _interface(raw: Any, where: str) -> str:
    """A network interface's name (whether this host has it is asked where it is used)."""
    name = _str(raw, where)
    if not INTERFACE_PATTERN.fullmatch(name):
        raise UsageError(where, f"{name!r} is not an interface name (1 to 15 letters, digits "
                         "and _.:-, as `ip link` lists them)")
    return name


def run_from_dict(data: dict[str, Any]) -> RunSpec:
    """The inverse of RunSpec.to_dict() (JSON turns tuples into lists)."""

    def tuples(d: dict[str, Any]) -> dict[str, Any]:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

    def worker(w: dict[str, Any]) -> WorkerSpec:
        at = w.get("slowdown_at")
        return WorkerSpec(**{**tuples(w), "slowdown_at": tuple(tuple(p) for p in at)
                             if at else None,
                             "jitter": tuple(w["jitter"]) if w.get("jitter") else None})

    target = data.get("target")
    data = dict(data)
    strategy = data.pop("strategy", None)  # run.json written before aggregators
    aggregator = data.get("aggregator") or {"name": strategy or "torch"}
    return RunSpec(**{
        **data,
        "aggregator": AggregatorSpec(**aggregator),
        "partition": PartitionSpec(**tuples(data["partition"])),
        "workers": tuple(worker(w) for w in data["workers"]),
        "optimizer": OptimizerSpec(**data.get("optimizer", {})),
        "target": TargetSpec(**target) if target else None,
        "loader": LoaderSpec(**data["loader"]) if data.get("loader") else None,
        "pipeline": _pipeline_from_dict(data.get("pipeline")),
    })


def _pipeline_from_dict(data: dict[str, Any] | None) -> PipelineSpec | None:
    if not data:
        return None
    split = data["split"]
    return PipelineSpec(**{**data, "virtual_workers": tuple(tuple(g) for g in
                                                            data["virtual_workers"]),
                           "split": split if isinstance(split, str) else tuple(split)})


def _workers(raw: Any, framework: str, where: str) -> tuple[WorkerSpec, ...]:
    if raw is None:
        raw = [{}]
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_WORKERS:
        raise UsageError(where, f"must be a list of 1 to {MAX_WORKERS} worker tables")
    workers = []
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        item = _table(item, w)
        _check_keys(item, WORKER_KEYS, w)
        device = _str(item.get("device", "cpu"), f"{w}.device")
        if not DEVICE_PATTERN.fullmatch(device):
            raise UsageError(f"{w}.device", f"{device!r} is not a device (cpu, cuda:N)")
        workers.append(
            WorkerSpec(
                device=device,
                threads=_int(item.get("threads", 1), f"{w}.threads", minimum=1,
                             maximum=MAX_THREADS),
                cores=_cores(item.get("cores"), f"{w}.cores"),
                slowdown=_float(item.get("slowdown", 1.0), f"{w}.slowdown", minimum=1.0,
                                maximum=MAX_SLOWDOWN),
                slowdown_at=_schedule(item.get("slowdown_at"), f"{w}.slowdown_at"),
                jitter=_jitter(item.get("jitter"), f"{w}.jitter"),
                framework=_choice(item.get("framework", framework), FRAMEWORKS, f"{w}.framework"),
            )
        )
    return tuple(workers)


def _cores(raw: Any, where: str) -> tuple[int, ...] | None:
    """Distinct CPU numbers. Whether this host has them is asked before a run starts
    (harness.run.launcher.check_devices): the suite still parses on a smaller machine."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise UsageError(where, "must be a non-empty list of core numbers")
    cores = tuple(_int(c, where, minimum=0, maximum=MAX_CORE) for c in raw)
    seen: set[int] = set()
    for core in cores:
        if core in seen:
            raise UsageError(where, f"core {core} is listed twice (each core at most once)")
        seen.add(core)
    return cores


def cpu_list(cores: set[int] | Sequence[int]) -> str:
    """CPU numbers in the Linux cpu-list form (0-3,8,10-11): one short line on any host."""
    spans: list[list[int]] = []  # [first, last]
    for core in sorted(set(cores)):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _jitter(raw: Any, where: str) -> tuple[float, float] | None:
    """{ probability = 0.2, factor = 3.0 }: each step is slowed by `factor` with
    `probability`."""
    if raw is None:
        return None
    raw = _table(raw, where)
    _check_keys(raw, {"probability", "factor"}, where)
    for key in ("probability", "factor"):
        if key not in raw:
            raise UsageError(f"{where}.{key}", "required")
    return (_float(raw["probability"], f"{where}.probability", minimum=0.0, maximum=1.0),
            _float(raw["factor"], f"{where}.factor", minimum=1.0, maximum=MAX_SLOWDOWN))


def _schedule(raw: Any, where: str) -> tuple[tuple[int, float], ...] | None:
    """[[step, factor], ...] with steps increasing and factors >= 1."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(
            isinstance(p, list) and len(p) == 2 for p in raw):
        raise UsageError(where, "must be a list of [step, factor] pairs")
    points = tuple((_int(p[0], where, minimum=0, maximum=MAX_STEPS),
                    _float(p[1], where, minimum=1.0, maximum=MAX_SLOWDOWN)) for p in raw)
    if any(b[0] <= a[0] for a, b in zip(points, points[1:], strict=False)):
        raise UsageError(where, "steps must increase from one pair to the next")
    return points


def _partition(raw: Any, n_workers: int, global_batch: int, where: str) -> PartitionSpec:
    raw = _table(raw, where)
    _check_keys(raw, PARTITION_KEYS, where)
    policy = _choice(raw.get("policy", "equal"), POLICIES, f"{where}.policy")
    sizes = weights = None
    if policy == "sizes":
        if "sizes" not in raw:
            raise UsageError(f"{where}.sizes", "required for policy 'sizes'")
        # 0 leaves a worker out: it computes nothing and takes no part in the exchange
        sizes = _int_list(raw["sizes"], f"{where}.sizes", n_workers, minimum=0,
                          maximum=global_batch)
        if sum(sizes) != global_batch:
            raise UsageError(
                f"{where}.sizes", f"sum {sum(sizes)} must equal global_batch {global_batch}"
            )
    elif "sizes" in raw:
        raise UsageError(f"{where}.sizes", f"only allowed with policy 'sizes', not {policy!r}")
    if policy == "weights":
        if "weights" not in raw:
            raise UsageError(f"{where}.weights", "required for policy 'weights'")
        raw_weights = raw["weights"]
        if not isinstance(raw_weights, list) or len(raw_weights) != n_workers:
            raise UsageError(f"{where}.weights", f"must be a list of {n_workers} numbers")
        weights = tuple(
            _float(v, f"{where}.weights", minimum=0.0, maximum=MAX_WEIGHT, strict=True)
            for v in raw_weights
        )
    elif "weights" in raw:
        raise UsageError(f"{where}.weights", f"only allowed with policy 'weights', not {policy!r}")
    profile_steps = _int(raw.get("profile_steps", 5), f"{where}.profile_steps", minimum=1,
                         maximum=MAX_STEPS)
    if policy not in ADAPTIVE:
        for key in sorted(ADAPTIVE_KEYS & set(raw)):
            raise UsageError(f"{where}.{key}",
                             f"only allowed with an adaptive policy ({', '.join(ADAPTIVE)})")
        return PartitionSpec(policy=policy, sizes=sizes, weights=weights,
                             profile_steps=profile_steps)
    leave_out = _bool(raw.get("leave_out", False), f"{where}.leave_out")
    if leave_out and policy != "model":
        raise UsageError(f"{where}.leave_out", f"needs policy 'model' (fitted lines predict "
                         f"the step with and without a worker), not {policy!r}")
    min_slice = _int(raw.get("min_slice", 1), f"{where}.min_slice", minimum=1,
                     maximum=global_batch)
    if min_slice * n_workers > global_batch:
        raise UsageError(f"{where}.min_slice", f"{min_slice} x {n_workers} workers exceeds "
                         f"global_batch {global_batch}")
    return PartitionSpec(
        policy=policy, profile_steps=profile_steps,
        initial=_choice(raw.get("initial", "equal"), ("equal", "profiled"), f"{where}.initial"),
        every=_int(raw.get("every", 10), f"{where}.every", minimum=1, maximum=MAX_STEPS),
        dead_band=_float(raw.get("dead_band", 0.05), f"{where}.dead_band", minimum=0.0,
                         maximum=MAX_TOLERANCE),
        # a fraction of the global batch
        max_move=_float(raw.get("max_move", 0.25), f"{where}.max_move", minimum=0.0,
                        maximum=1.0, strict=True),
        min_slice=min_slice,
        smoothing=_float(raw.get("smoothing", 0.5), f"{where}.smoothing", minimum=0.0,
                         maximum=1.0, strict=True),
        max_ratio=_float(raw.get("max_ratio", 2.0), f"{where}.max_ratio", minimum=1.0,
                         maximum=MAX_SLICE_RATIO, strict=True),
        reset=_float(raw.get("reset", 0.3), f"{where}.reset", minimum=0.0,
                     maximum=MAX_TOLERANCE, strict=True),
        leave_out=leave_out,
    )


def _optimizer(raw: Any, lr: float, steps: int, where: str) -> OptimizerSpec:
    """`"adamw"` or `{ name = "adamw", weight_decay = 0.01, warmup_steps = 10, ... }`."""
    if isinstance(raw, str):
        raw = {"name": raw}
    raw = _table(raw, where)
    _check_keys(raw, set(OPTIMIZER_KEYS), where)
    name = _choice(raw.get("name", "sgd"), OPTIMIZERS, f"{where}.name")
    for key in raw:
        if name not in OPTIMIZER_KEYS[key]:
            raise UsageError(f"{where}.{key}", f"only allowed with optimizer "
                             f"{' or '.join(repr(o) for o in OPTIMIZER_KEYS[key])}, not {name!r}")
    default = OptimizerSpec()

    def fraction(key: str) -> float:  # 0 <= value < 1
        return _float(raw.get(key, getattr(default, key)), f"{where}.{key}", minimum=0.0,
                      maximum=1.0, below_maximum=True)

    warmup = _int(raw.get("warmup_steps", 0), f"{where}.warmup_steps", minimum=0,
                  maximum=MAX_STEPS)
    if warmup > steps:
        raise UsageError(f"{where}.warmup_steps", f"{warmup} exceeds steps ({steps})")
    min_lr = _float(raw.get("min_lr", 0.0), f"{where}.min_lr", minimum=0.0, maximum=MAX_LR)
    if min_lr > lr:
        raise UsageError(f"{where}.min_lr", f"{min_lr} is above lr ({lr})")
    return OptimizerSpec(
        name=name, momentum=fraction("momentum"),
        nesterov=_bool(raw.get("nesterov", False), f"{where}.nesterov"),
        beta1=fraction("beta1"), beta2=fraction("beta2"),
        eps=_float(raw.get("eps", default.eps), f"{where}.eps", minimum=0.0, maximum=MAX_EPS,
                   strict=True),
        weight_decay=_float(raw.get("weight_decay", 0.0), f"{where}.weight_decay", minimum=0.0,
                            maximum=MAX_WEIGHT_DECAY),
        warmup_steps=warmup, decay=_choice(raw.get("decay", "none"), DECAYS, f"{where}.decay"),
        min_lr=min_lr)


def _aggregator(values: dict[str, Any], workers: Sequence[WorkerSpec], at: Any) -> AggregatorSpec:
    """`aggregator = "ps-sync"` or `{ name = "ssp", staleness = 2, servers = 2, ... }`; the
    older `strategy = name` means `aggregator = name`."""
    raw, where = values["aggregator"], at("aggregator")
    if values["strategy"] is not None:
        if raw is not None:
            raise UsageError(at("strategy"), "give aggregator or strategy (its older name), "
                             "not both")
        raw, where = values["strategy"], at("strategy")
    if raw is None:
        raw = "torch"
    if isinstance(raw, str):
        raw, where_name = {"name": raw}, where
    else:
        raw, where_name = _table(raw, where), f"{where}.name"
    _check_keys(raw, {"name", *SPEC_KEYS}, where)
    name = _choice(raw.get("name", "torch"), AGGREGATORS, where_name)
    allowed = aggregator_kind(name).keys
    for key in raw:
        if key != "name" and key not in allowed:
            takes = f"takes only {', '.join(allowed)}" if allowed else "takes no options"
            raise UsageError(f"{where}.{key}", f"not an option of {name!r} ({name!r} {takes})")
    spec = AggregatorSpec(
        name=name,
        staleness=_int(raw.get("staleness", 0), f"{where}.staleness", minimum=0,
                       maximum=MAX_STEPS),
        backup=_int(raw.get("backup", 0), f"{where}.backup", minimum=0, maximum=MAX_WORKERS),
        local_steps=_int(raw.get("local_steps", 1), f"{where}.local_steps", minimum=1,
                         maximum=MAX_STEPS),
        servers=_int(raw.get("servers", 1), f"{where}.servers", minimum=1,
                     maximum=MAX_SERVERS),
        staleness_lr=_choice(raw.get("staleness_lr", "none"), STALENESS_LR,
                             f"{where}.staleness_lr"),
    )
    if (problem := aggregator_problem(spec, workers)) is not None:
        key, why = problem
        raise UsageError(where_name if key == "name" else f"{where}.{key}", why)
    return spec


def _loader(raw: Any, images: bool, where: str) -> LoaderSpec | None:
    """`{ workers = 2, prefetch = 4, kind = "threads", decode = true, augment = true }`;
    decode and augment only where the samples are images with a label."""
    if raw is None:
        return None
    raw = _table(raw, where)
    _check_keys(raw, LOADER_KEYS, where)
    workers = _int(raw.get("workers", 2), f"{where}.workers", minimum=1,
                   maximum=MAX_LOADER_WORKERS)
    prefetch = _int(raw.get("prefetch", 4), f"{where}.prefetch", minimum=1, maximum=MAX_PREFETCH)
    decode = _bool(raw.get("decode", False), f"{where}.decode")
    augment = _bool(raw.get("augment", False), f"{where}.augment")
    for key, on in (("decode", decode), ("augment", augment)):
        if on and not images:
            raise UsageError(f"{where}.{key}", "only for image classification workloads "
                             "(mlp, cnn, resnet, vgg)")
    return LoaderSpec(workers=workers, prefetch=prefetch,
                      kind=_choice(raw.get("kind", "threads"), KINDS, f"{where}.kind"),
                      decode=decode, augment=augment)


def _target(raw: Any, metric: str, where: str) -> TargetSpec | None:
    """`{ metric = "accuracy", value = 0.8 }`; the metric defaults to the workload's."""
    if raw is None:
        return None
    raw = _table(raw, where)
    _check_keys(raw, TARGET_KEYS, where)
    name = _choice(raw.get("metric", metric), (metric, "loss"), f"{where}.metric")
    if "value" not in raw:
        raise UsageError(f"{where}.value", "required (the held-out value to reach)")
    value = _float(raw["value"], f"{where}.value", minimum=0.0, maximum=MAX_TARGET_LOSS)
    if name != "loss" and value > 1.0:
        raise UsageError(f"{where}.value", f"{value} is not allowed ({name} is 0 to 1)")
    return TargetSpec(name, value)


# -- small typed readers: each names the field and what is allowed ---------------------------


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            shown = key if key.isprintable() else repr(key)  # errors stay on one line
            field_name = f"{where}.{shown}" if where else shown
            raise UsageError(field_name, f"unknown key (allowed: {', '.join(sorted(allowed))})")


# Python type -> what a TOML author calls it
TOML_TYPES = {"str": "a string", "int": "an integer", "float": "a float", "bool": "a boolean",
              "list": "an array", "dict": "a table", "datetime": "a date-time",
              "date": "a date", "time": "a time"}


def _toml_type(value: Any) -> str:
    name = type(value).__name__
    return TOML_TYPES.get(name, name)


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(where, f"must be a table, not {_toml_type(value)}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise UsageError(where, f"must be a string, not {_toml_type(value)}")
    return value


def _name(value: Any, where: str) -> str:
    value = _str(value, where)
    if not NAME_PATTERN.fullmatch(value):
        raise UsageError(where, f"{value!r} is not a name (letters, digits, '.', '_', '-')")
    if len(value) > MAX_NAME_LENGTH:
        raise UsageError(where, f"{len(value)} characters is too long (at most "
                         f"{MAX_NAME_LENGTH}: run folders are named after it)")
    return value


def _choice(value: Any, allowed: Any, where: str) -> str:
    value = _str(value, where)
    if value not in allowed:
        raise UsageError(where, f"unknown {value!r} (allowed: {', '.join(sorted(allowed))})")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(where, f"must be true or false, not {_toml_type(value)}")
    return value


def _int(value: Any, where: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(where, f"must be an integer, not {_toml_type(value)}")
    if value < minimum:
        raise UsageError(where, f"{_short(value)} is below the minimum {minimum}")
    if value > maximum:
        raise UsageError(where, f"{_short(value)} is not allowed ({minimum} to {maximum})")
    return value


def _float(value: Any, where: str, minimum: float, maximum: float, strict: bool = False,
           below_maximum: bool = False) -> float:
    """A finite number from `minimum` (excluded when strict) to `maximum` (excluded when
    below_maximum); an integer is taken as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(where, f"must be a number, not {_toml_type(value)}")
    if not math.isfinite(value):
        raise UsageError(where, f"{value} is not allowed (must be a finite number)")
    if value < minimum or (strict and value == minimum):
        bound = f"above {minimum}" if strict else f"at least {minimum}"
        raise UsageError(where, f"{value} is not allowed (must be {bound})")
    if value > maximum or (below_maximum and value == maximum):
        raise UsageError(where, f"{_short(value)} is not allowed "
                         f"({_range(minimum, maximum, strict, below_maximum)})")
    return float(value)


def _range(minimum: float, maximum: float, strict: bool, below_maximum: bool) -> str:
    """'0 to 1', or with an end excluded 'above 0, at most 1' / 'at least 0, below 1'."""
    if not strict and not below_maximum:
        return f"{minimum:g} to {maximum:g}"
    low = f"above {minimum:g}" if strict else f"at least {minimum:g}"
    high = f"below {maximum:g}" if below_maximum else f"at most {maximum:g}"
    return f"{low}, {high}"


def _short(value: float) -> str:
    """A number as written, cut short when it has hundreds of digits (TOML integers may)."""
    text = str(value)
    return text if len(text) <= 30 else f"{text[:12]}...({len(text)} digits)"


def _int_list_of(value: Any, where: str, length: int, what: str) -> tuple[int, ...]:
    """A list of `length` positive integers."""
    if not isinstance(value, list) or len(value) != length:
        raise UsageError(where, f"must be a list of {length} integers, {what}")
    return tuple(_int(v, where, 1, MAX_STEPS) for v in value)


def _int_list(value: Any, where: str, length: int, minimum: int, maximum: int
              ) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) != length:
        raise UsageError(where, f"must be a list of {length} integers, one per worker")
    return tuple(_int(v, where, minimum, maximum) for v in value)
