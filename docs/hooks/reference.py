"""The reference pages' tables, generated from the code: written into the pages by
`python docs/hooks/reference.py`, checked by the mkdocs hook at every build.

The pages under docs/reference/ hold the prose; where one holds a region such as
`<!-- hetbench:suite-keys -->` ... `<!-- /hetbench:suite-keys -->`, the text between the
markers is generated from the code and committed: the CLI's help from its argparse parsers,
every suite key from the spec dataclasses (`dataclasses.fields`, so a new field appears
without anyone listing it), the step record's fields from `RECORD_DTYPE`, the run
directory's file names from their constants, the loop's API from its source. The site is
built from the pages as committed: a region the code no longer matches, or a marker no page
holds, fails the build (`on_page_markdown`, `on_post_build`), as tests/test_docs.py does.

Why a hook and not the mkdocs-gen-files plugin: the generated parts sit inside
hand-written pages (a marker is one line, readable on GitHub too), a hook is one file of
plain Python that tests/test_docs.py imports directly, and it adds no dependency to the
`docs` extra. Nothing here imports mkdocs at module level (the test does not need it) or
any framework: the modules read below import no framework (DESIGN.md, Principles).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout: build the docs of this code
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# --- Every import of hetbench's own modules, in this one block.
import hetbench.harness  # noqa: E402  (SCHEMA_VERSION)
from hetbench.adapters import FRAMEWORKS  # noqa: E402
from hetbench.harness.cli import main as cli_main  # noqa: E402
from hetbench.harness.partition import policies  # noqa: E402
from hetbench.harness.records import collector, manifest, rundir  # noqa: E402
from hetbench.harness.records import fields as step_fields  # noqa: E402
from hetbench.harness.spec import aggregators as exchange  # noqa: E402  (the aggregators' registry)
from hetbench.harness.spec import (  # noqa: E402
    builtin,
    partitions,
    pipelines,
    profiling,  # noqa: E402
)
from hetbench.harness.spec import loaders as loader  # noqa: E402
from hetbench.harness.spec import nodes as spec_nodes  # noqa: E402
from hetbench.harness.spec import optimizers as optim  # noqa: E402
from hetbench.harness.spec import suite as spec_suite  # noqa: E402  (SuiteSpec, RunSpec, RUN_KEYS, ...)
from hetbench.harness.spec import workers as spec_workers  # noqa: E402
from hetbench.harness.system import sampler  # noqa: E402
from hetbench.workloads import DATASETS, WORKLOADS, get_workload  # noqa: E402
from hetbench.workloads import job as user_job  # noqa: E402
from hetbench.workloads import models as workload_models  # noqa: E402

# --- end of the imports of hetbench


# ---------------------------------------------------------------------------------------
# Small Markdown helpers

def _cell(text: Any) -> str:
    """Text for a table cell: one line, pipes escaped outside code spans (Python-Markdown's
    tables leave a pipe inside backticks alone, and would show the backslash there)."""
    parts = " ".join(str(text).split()).split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _code(value: Any) -> str:
    return f"`{value}`"


def _toml(value: Any) -> str:
    """A Python default as a suite file would write it."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, str):
        return _code(f'"{value}"')
    if isinstance(value, tuple | list):
        return _code("[" + ", ".join(_plain(v) for v in value) + "]")
    if isinstance(value, dict):
        return _code("{}") if not value else _code(value)
    return _code(value)


def _plain(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_plain(v) for v in value) + "]"
    return str(value)


def _choices(values: Iterable[Any]) -> str:
    return ", ".join(_code(v) for v in values)


def _type(field: dataclasses.Field[Any]) -> str:
    # `from __future__ import annotations`: the annotation as written in the code
    text = field.type if isinstance(field.type, str) else getattr(field.type, "__name__",
                                                                     str(field.type))
    return _code(text.replace(" | ", " or "))


def _table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# CLI

def cli_markdown() -> str:
    """`hetbench --help`, then every subcommand's help, in the order the CLI registers them
    (hetbench.harness.cli.main's map of subcommands)."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for the page
    try:
        parser = cli_main.build_parser()
        parts = ["## hetbench", "", "```text", parser.format_help().rstrip(), "```", ""]
        for action in parser._actions:  # argparse keeps its subparsers only here
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    parts += [f"## hetbench {name}", "", "```text",
                              sub.format_help().rstrip(), "```", ""]
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------
# Suite keys

# One line per key; a key without one still gets its row (its name, type and default).
DESCRIPTIONS: dict[str, str] = {
    # [suite]
    "SuiteSpec.name": "the suite's name: results go to `<out>/<name>/`",
    "SuiteSpec.repeats": "repeats of every run, interleaved: all runs of repeat 0, then "
                         "repeat 1, ...",
    "SuiteSpec.runs": "the `[[runs]]` tables, one per run",
    "SuiteSpec.source": "where the suite was read from (a path or `builtin:NAME`)",
    "SuiteSpec.description": "one line, shown by `hetbench suites`",
    "SuiteSpec.extra": "anything else the code attaches to a suite",
    "SuiteSpec.nodes": "the `[[nodes]]` tables, node 0 first: each host's link in a suite "
                       "across hosts ([Run on several hosts](../howto/multi-host.md))",
    "NodeSpec.link": "`{ rate = \"100mbit\", delay = \"1ms\", jitter = ..., loss = ... }` "
                     "in tc's units: shaped by the node's launcher on hetbench's testbed, "
                     "recorded only (with a warning) on real hosts",
    # run keys
    "RunSpec.name": "the run's name, unique in the suite (letters, digits, `.`, `_`, `-`)",
    "RunSpec.framework": "every worker's framework unless the worker sets its own",
    "RunSpec.workload": "the model: a built-in name ([Workloads](../concepts/workloads.md)), "
                        "or your own factory by import path, `package.module:factory` or "
                        "`file.py:factory` ([Your own job](../reference/job.md))",
    "RunSpec.dataset": "the data set; default: the workload's own",
    "RunSpec.steps": "training steps (under asynchronous schemes: global batches applied)",
    "RunSpec.warmup_steps": "first steps, recorded and marked `warmup`, left out of "
                            "summaries; must be below `steps`",
    "RunSpec.global_batch": "samples per step, over all workers; at least the number of "
                            "workers and at most the data set's size",
    "RunSpec.lr": "learning rate (the optimizer's peak rate with a schedule)",
    "RunSpec.seed": "initial weights, batch order, jitter and masking all derive from it",
    "RunSpec.partition": "a table: how the global batch is sliced over the workers "
                         "([partition](#partition))",
    "RunSpec.workers": "a list of tables, one per worker, in rank order ([workers](#workers))",
    "RunSpec.timeout_s": "any collective waiting longer fails the run",
    "RunSpec.instrument": "`false`: only step begin and end are recorded (the overhead "
                          "baseline)",
    "RunSpec.calibrate": "time each worker alone on its own slice before training "
                         "(heterogeneous efficiency)",
    "RunSpec.calibrate_steps": "steps timed per worker when `calibrate` is true",
    "RunSpec.counters_every": "the CPU clocks (main thread, all threads) and getrusage "
                              "(context switches, user and system CPU) are read over one "
                              "step in this many; the other steps record -1 there (each "
                              "read is a system call costing 7-20 us inside a step); 1: "
                              "every step",
    "RunSpec.keep_freed_memory": "each worker tells glibc's malloc to keep the memory a "
                                 "step frees (allocations up to 32 MiB reuse the heap; "
                                 "its free top is kept up to 128 MiB), where by default "
                                 "glibc returns it to the OS and the next step faults it "
                                 "back in; `false`: glibc's defaults, to study what they "
                                 "cost",
    "RunSpec.gc": "Python's cyclic garbage collector over the steps: \"auto\" as Python "
                  "runs it; \"frozen\": what was built before the first step (model, data, "
                  "framework) is frozen out of its scans (gc.freeze), the garbage the steps "
                  "make still collected; \"off\": it never runs during the steps (garbage "
                  "in reference cycles then grows until the last step, when it is "
                  "collected): what `hetbench explain` removes `gc` with",
    "RunSpec.trace_steps": "trace.json holds the run's last this many steps (all of a "
                           "shorter run), or the steps of a window \"A-B\" (A to B); 0: no "
                           "trace; at most 100,000 worker-steps either way, the last that "
                           "fit (about 130 MB: what Perfetto's UI loads)",
    "RunSpec.aggregator": "how gradients meet: a name or a table ([aggregator](#aggregator))",
    "RunSpec.size": "model size",
    "RunSpec.optimizer": "a name or a table ([optimizer](#optimizer))",
    "RunSpec.eval_every": "held-out evaluation every N steps (and before the first and after "
                          "the last) into eval.parquet; not set: none",
    "RunSpec.target": "the held-out value to reach, a table ([target](#target)); needs "
                      "`eval_every`",
    "RunSpec.loader": "a table: load batches through an input pipeline ([loader](#loader)); "
                      "not set: slices of the in-memory arrays",
    "RunSpec.on_worker_failure": "`continue`: ps-async goes on without a worker that dies",
    "RunSpec.interface": "torchrun across hosts: the network interface every listener binds",
    "RunSpec.pipeline": "a table: pipeline the model over virtual workers "
                        "([pipeline](#pipeline)); needs `virtual_workers`",
    "RunSpec.placement": "where a parameter-server aggregator puts the layers",
    "RunSpec.project": "a workload named by import path only: the folder it is imported "
                       "from, relative to the suite's (default: the suite file's folder; "
                       "[Your own job](../reference/job.md))",
    "RunSpec.batchnorm": "a workload named by import path only: its BatchNorm layers' "
                         "statistics, each worker's slice's (`slice`) or the global "
                         "batch's (`global`, every forward gathering the workers' sums)",
    "RunSpec.accumulate": "a workload named by import path only: micro-batches per slice, "
                          "forward and backward over each in turn (one's memory), their "
                          "gradients summed before the step's one exchange (gradient "
                          "accumulation; BatchNorm takes a micro-batch's statistics). Not "
                          "with `ddp`, `batchnorm = \"global\"`, a pipeline or `fc-on-server`",
    "RunSpec.profile": "a table: torch.profiler traces of a window of steps, PyTorch runs "
                       "only ([profile](#profile); [Profiler traces in HTA]"
                       "(../howto/profiler.md))",
    "RunSpec.strategy": "the older key for the frameworks' own aggregators: an aggregator "
                        "name",
    "RunSpec.virtual_workers": "ranks of each virtual worker in stage order, e.g. "
                               "`[[0, 1], [2, 3]]`, or `{ allocation = ..., size = k }`",
    # workers
    "WorkerSpec.device": "`cpu` or `cuda:N`; a missing device fails the suite before "
                         "anything runs",
    "WorkerSpec.threads": "the framework's intra-op threads",
    "WorkerSpec.cores": "CPU affinity, set before the framework is imported",
    "WorkerSpec.slowdown": "every compute phase stretched by this factor (>= 1): emulated "
                           "heterogeneity",
    "WorkerSpec.framework": "this worker's framework (mixed jobs); default: the run's",
    "WorkerSpec.slowdown_at": "`[[step, factor], ...]`: a slowdown that changes during the "
                              "run, linear between points; overrides `slowdown`",
    "WorkerSpec.jitter": "`{ probability = p, factor = f }`: each step slowed by f with "
                         "probability p, drawn from seed, rank and step",
    "WorkerSpec.loader_workers": "this worker's input-pipeline processes (threads) in place "
                                 "of the run's `loader.workers`; 0: it loads in its training "
                                 "process (a starved pipeline beside fed ones); needs a "
                                 "`loader` table",
    # partition
    "PartitionSpec.policy": "how the global batch is sliced",
    "PartitionSpec.sizes": "`sizes`: one slice per worker, summing to the global batch; 0 "
                           "leaves a worker out",
    "PartitionSpec.weights": "`weights`: sizes in proportion to these",
    "PartitionSpec.profile_steps": "`profiled`: steps each worker is timed alone at each of "
                                   "its two slice sizes",
    "PartitionSpec.initial": "adaptive policies: the partition they start from",
    "PartitionSpec.every": "adaptive policies: steps between updates",
    "PartitionSpec.dead_band": "adaptive: no change while the window's imbalance is below it",
    "PartitionSpec.max_move": "adaptive: a slice moves by at most this fraction of the global "
                              "batch per update",
    "PartitionSpec.min_slice": "adaptive: the smallest slice (at least 2 for a job whose "
                               "BatchNorm takes each slice's statistics)",
    "PartitionSpec.smoothing": "`proportional`: weight of the newest window in the moving "
                               "average",
    "PartitionSpec.max_ratio": "adaptive: a slice at most grows or shrinks by this factor per "
                               "update (`model`: not where the worker's line was fitted on "
                               "sizes wide apart)",
    "PartitionSpec.reset": "adaptive: a window this far from the prediction restarts the "
                           "worker's history",
    "PartitionSpec.leave_out": "`model` only: leave out a worker that does not pay for itself",
    # aggregator
    "AggregatorSpec.name": "the synchronisation scheme",
    "AggregatorSpec.staleness": "`ssp`: a worker at clock c waits until every worker reached "
                                "c - s",
    "AggregatorSpec.backup": "`backup`: gradients dropped per step (the last to arrive)",
    "AggregatorSpec.local_steps": "`local-sgd`: steps between parameter averages (H)",
    "AggregatorSpec.servers": "parameter servers the parameters are sharded over",
    "AggregatorSpec.server_nodes": "the node (host) each server runs on, across hosts: "
                                   "`[0, 1]`, one per server (MXNet's one server: `[1]`); "
                                   "default all on node 0",
    "AggregatorSpec.staleness_lr": "`dynsgd`: an update is scaled by 1 / (1 + its staleness)",
    "AggregatorSpec.bucket_mb": "`ddp`: the size of a gradient bucket in MB (DDP's "
                                "`bucket_cap_mb`); its all-reduce starts as soon as the "
                                "backward has filled it",
    "AggregatorSpec.comm_hook": "`ddp`: who all-reduces a bucket: `builtin`, DDP's own "
                                "all-reduce in C++ (each bucket's `ready_ns` recorded, "
                                "`reduced_ns` 0), or `timed`, hetbench's comm hook in Python, "
                                "which also records when each all-reduce was done and costs "
                                "3-4% of a ResNet small step on 2 CPU workers",
    # optimizer
    "OptimizerSpec.name": "the update rule, run once in torch on the reduced buffer",
    "OptimizerSpec.momentum": "momentum factor",
    "OptimizerSpec.nesterov": "Nesterov momentum",
    "OptimizerSpec.beta1": "AdamW's first-moment decay",
    "OptimizerSpec.beta2": "AdamW's second-moment decay",
    "OptimizerSpec.eps": "AdamW's epsilon",
    "OptimizerSpec.weight_decay": "L2 for sgd and momentum, decoupled for adamw",
    "OptimizerSpec.warmup_steps": "linear warm-up from lr / warmup_steps",
    "OptimizerSpec.decay": "learning-rate decay to `min_lr` at the last step",
    "OptimizerSpec.min_lr": "the rate the decay ends at",
    # loader
    "LoaderSpec.workers": "background threads or processes making batches",
    "LoaderSpec.prefetch": "steps made ahead",
    "LoaderSpec.kind": "threads, or forked processes (batches cross a pipe)",
    "LoaderSpec.decode": "store training images as PNG and decode every batch (Pillow)",
    "LoaderSpec.augment": "pad by 4, random crop, flip half (image classification only)",
    "LoaderSpec.pin_memory": "a workload named by import path only: torch's DataLoader "
                             "puts its batches in page-locked memory",
    # pipeline
    "PipelineSpec.virtual_workers": "set by the run key `virtual_workers`: the ranks of "
                                    "each virtual worker, in stage order",
    "PipelineSpec.schedule": "torch.distributed.pipelining's schedule",
    "PipelineSpec.micro_batches": "Nm per wave; must divide each virtual worker's slice",
    "PipelineSpec.wave_bound": "D: 0 all-reduces every wave; D > 0 runs parameter servers "
                               "(`wsp`), a virtual worker at most D waves ahead",
    "PipelineSpec.split": "`profiled`, or layers per stage (e.g. `[3, 3]`)",
    "PipelineSpec.profile_steps": "timed passes per layer when the split is profiled",
    "PipelineSpec.allocation": "set by `virtual_workers = { allocation = ... }`: how devices "
                               "were grouped (`given`: listed by hand)",
    # profile
    "ProfileSpec.steps": "the window \"A-B\", steps A to B (at most 100): marked `profiled` "
                         "with the step after it, and left out of every summary; at least "
                         "one step after warm-up must stay out of it",
    "ProfileSpec.first": "the window's first step (from `steps`)",
    "ProfileSpec.last": "the window's last step (from `steps`)",
    "ProfileSpec.ranks": "`\"all\"` or a list of ranks: the workers whose traces are "
                         "recorded (the others wait for them in the window's exchanges)",
    # target
    "TargetSpec.metric": "the workload's held-out metric, or `loss`",
    "TargetSpec.value": "reached at or above (accuracies) or at or below (loss)",
}


def _aggregators_taking(key: str) -> list[str]:
    return [name for name, kind in exchange.AGGREGATORS.items() if key in kind.keys]


# (class name, field) -> allowed values, read from the code's own collections
ALLOWED: dict[tuple[str, str], Callable[[], str]] = {
    ("RunSpec", "framework"): lambda: _choices(FRAMEWORKS),
    ("RunSpec", "workload"): lambda: _choices(WORKLOADS),
    ("RunSpec", "dataset"): lambda: _choices(DATASETS) + " (each workload takes some)",
    ("RunSpec", "size"): lambda: _choices(workload_models.SIZES),
    ("RunSpec", "on_worker_failure"): lambda: _choices(spec_suite.ON_WORKER_FAILURE),
    ("RunSpec", "aggregator"): lambda: _choices(exchange.AGGREGATORS) + ", or a table",
    ("RunSpec", "strategy"): lambda: _choices(n for n, k in exchange.AGGREGATORS.items()
                                              if k.framework is not None),
    ("RunSpec", "optimizer"): lambda: _choices(optim.OPTIMIZERS) + ", or a table",
    ("RunSpec", "placement"): lambda: _choices(exchange.PLACEMENTS) + " (not set: `sharded`)",
    ("RunSpec", "target"): lambda: "`{ value = X }` or `{ metric = \"loss\", value = X }`",
    ("RunSpec", "virtual_workers"): lambda: "a list of rank lists, or allocation "
                                            + _choices(pipelines.ALLOCATIONS),
    ("WorkerSpec", "device"): lambda: f"matches `{spec_workers.DEVICE_PATTERN.pattern}`",
    ("WorkerSpec", "framework"): lambda: _choices(FRAMEWORKS),
    ("PartitionSpec", "policy"): lambda: _choices(dict.fromkeys([*policies.POLICIES,
                                                                 *policies.ADAPTIVE])),
    ("PartitionSpec", "initial"): lambda: _choices(("equal", "profiled")),
    ("PartitionSpec", "leave_out"): lambda: "policy `model`, aggregators "
                                            + _choices(n for n, k in exchange.AGGREGATORS.items()
                                                     if k.leaves_out),
    ("AggregatorSpec", "name"): lambda: _choices(exchange.AGGREGATORS),
    ("AggregatorSpec", "staleness_lr"): lambda: _choices(exchange.STALENESS_LR),
    ("AggregatorSpec", "bucket_mb"): lambda: f"above 0, at most {exchange.MAX_BUCKET_MB:g}",
    ("AggregatorSpec", "comm_hook"): lambda: _choices(exchange.COMM_HOOKS),
    ("OptimizerSpec", "name"): lambda: _choices(optim.OPTIMIZERS),
    ("OptimizerSpec", "decay"): lambda: _choices(optim.DECAYS),
    ("LoaderSpec", "kind"): lambda: _choices(loader.KINDS),
    ("PipelineSpec", "schedule"): lambda: _choices(pipelines.SCHEDULES),
    ("PipelineSpec", "split"): lambda: f"`\"{pipelines.PROFILED}\"` or a list of layer counts",
    ("PipelineSpec", "allocation"): lambda: _choices(("given", *pipelines.ALLOCATIONS)),
    ("TargetSpec", "metric"): lambda: "`loss`, or the workload's: `accuracy` (classifiers), "
                                      "`token_accuracy` (token outputs)",
}


class Section:
    """One table of the suite-key reference: a spec dataclass and the keys a suite file
    gives it. (A plain class: mkdocs and the test load this file by path.)"""

    def __init__(self, title: str, spec: type, keys: Iterable[str], where: str,
                 defaults: dict[str, Any] | None = None,
                 used_by: Callable[[str], str] | None = None) -> None:
        self.title = title  # also the heading's anchor
        self.spec = spec  # the frozen dataclass whose every field the table lists
        self.keys = frozenset(keys)  # the keys a suite file accepts there
        self.where = where  # where the table is written in a suite file
        self.defaults = defaults or {}  # suite-level defaults (RUN_DEFAULTS)
        self.used_by = used_by  # which names (aggregators, optimizers) a key applies to


def suite_key_sections() -> list[Section]:
    optimizer_keys = optim.OPTIMIZER_KEYS
    return [
        Section("suite", spec_suite.SuiteSpec, spec_suite.SUITE_KEYS, "`[suite]`"),
        Section("runs", spec_suite.RunSpec, spec_suite.RUN_KEYS,
                "each `[[runs]]` table, and `[defaults]` (every key but `name`)",
                defaults=dict(spec_suite.RUN_DEFAULTS)),
        Section("workers", spec_workers.WorkerSpec, spec_workers.WORKER_KEYS,
                "each table of a run's `workers = [ {...}, ... ]`"),
        Section("partition", partitions.PartitionSpec, partitions.PARTITION_KEYS,
                "a run's `partition = { policy = ..., ... }`"),
        Section("aggregator", exchange.AggregatorSpec,
                {"name", *exchange.SPEC_KEYS},
                "a run's `aggregator = \"name\"` or `aggregator = { name = ..., ... }`",
                used_by=lambda key: _choices(_aggregators_taking(key)) if key != "name"
                else "every aggregator"),
        Section("optimizer", optim.OptimizerSpec, optimizer_keys,
                "a run's `optimizer = \"name\"` or `optimizer = { name = ..., ... }`",
                used_by=lambda key: _choices(optimizer_keys.get(key, ()))),
        Section("loader", loader.LoaderSpec, loader.LOADER_KEYS,
                "a run's `loader = { ... }`"),
        Section("pipeline", pipelines.PipelineSpec, pipelines.PIPELINE_KEYS,
                "a run's `pipeline = { ... }` (with the run key `virtual_workers`)"),
        Section("profile", profiling.ProfileSpec, profiling.PROFILE_KEYS,
                "a run's `profile = { steps = \"A-B\", ranks = ... }`"),
        Section("target", spec_suite.TargetSpec, spec_suite.TARGET_KEYS,
                "a run's `target = { ... }`"),
        Section("nodes", spec_nodes.NodeSpec, spec_nodes.NODE_KEYS,
                "each `[[nodes]]` table (node 0 first)"),
    ]


# What the suite parser (spec_suite.parse_suite, parse_run) fills in where the dataclass
# itself has no default: the suite file may leave these out.
PARSER_DEFAULTS: dict[str, str] = {
    "SuiteSpec.name": "the file's name",
    "SuiteSpec.repeats": "`1`",
    "RunSpec.partition": "`{ policy = \"equal\" }`",
    "TargetSpec.metric": "the workload's",
    "ProfileSpec.ranks": "`\"all\"`",
}


def _default(section: Section, field: dataclasses.Field[Any]) -> str:
    if f"{section.spec.__name__}.{field.name}" in PARSER_DEFAULTS:
        return PARSER_DEFAULTS[f"{section.spec.__name__}.{field.name}"]
    if field.name in section.defaults:
        value = section.defaults[field.name]
        if field.name == "aggregator" and value is None:
            return _toml("torch")
        if field.name == "dataset" and value is None:
            return "the workload's"
        if field.name == "eval_every" and value is None:
            return "not set (no evaluation)"
        return _toml(value)
    if field.default is not dataclasses.MISSING:
        return _toml(field.default)
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        return _toml(getattr(value, "name", value))  # a spec: its name (AggregatorSpec)
    return "required"


def section_rows(section: Section) -> list[list[str]]:
    """A row per dataclass field, then a row per suite key that is no field."""
    cls = section.spec.__name__
    header_used = section.used_by is not None
    rows = []
    names = [f.name for f in dataclasses.fields(section.spec)]
    for field in dataclasses.fields(section.spec):
        in_suite = field.name in section.keys
        allowed = ALLOWED.get((cls, field.name), lambda: "")()
        row = [_code(field.name), _type(field), _default(section, field), allowed,
               DESCRIPTIONS.get(f"{cls}.{field.name}", "")
               + ("" if in_suite else " (not a suite key)")]
        if header_used:
            row.insert(4, section.used_by(field.name) if in_suite else "")
        rows.append(row)
    for key in sorted(section.keys - set(names)):
        default = _toml(section.defaults[key]) if key in section.defaults else ""
        row = [_code(key), "", default, ALLOWED.get((cls, key), lambda: "")(),
               DESCRIPTIONS.get(f"{cls}.{key}", "") + " (a suite key only)"]
        if header_used:
            row.insert(4, section.used_by(key))
        rows.append(row)
    return rows


def section_markdown(section: Section) -> str:
    header = ["key", "type", "default", "allowed", "description"]
    if section.used_by is not None:
        header.insert(4, "applies to")
    return "\n".join([
        f"### {section.title}", "",
        f"Where: {section.where}. From `{section.spec.__module__}.{section.spec.__name__}`.",
        "", _table(header, section_rows(section)), ""])


def aggregators_markdown() -> str:
    rows = [[_code(name), kind.framework or "any", "yes" if kind.lockstep else "no",
             _choices(kind.keys) if kind.keys else "", kind.summary]
            for name, kind in exchange.AGGREGATORS.items()]
    return _table(["aggregator", "framework", "lockstep", "keys", "what"], rows)


def limits_markdown() -> str:
    rows = [[_code(name), _code(f"{getattr(spec_suite, name):,}"
                                if isinstance(getattr(spec_suite, name), int)
                                else getattr(spec_suite, name))]
            for name in sorted(vars(spec_suite)) if name.startswith("MAX_")]
    return _table(["limit", "value"], rows)


def suite_keys_markdown() -> str:
    parts = [section_markdown(s) for s in suite_key_sections()]
    parts += ["### aggregators", "", "Every name `aggregator` takes, from the registry "
              f"`{exchange.__name__}.AGGREGATORS`:", "", aggregators_markdown(), "",
              "### limits", "", "Upper bounds every value is checked against "
              f"(`{spec_suite.__name__}`): a typo is refused before anything runs.", "",
              limits_markdown(), ""]
    return "\n".join(parts)


def builtin_suites_markdown() -> str:
    rows = [[_code(name), builtin.builtin_summary(name)] for name in builtin.builtin_suites()]
    return _table(["suite", "what"], rows)


def catalogue_markdown() -> str:
    """Frameworks, workloads and data sets a suite may name, from their registries."""
    workloads = [[_code(name), ", ".join(_code(d) for d in w.datasets), w.loss,
                  w.description]
                 for name, w in ((n, get_workload(n)) for n in WORKLOADS)]
    return "\n".join([
        "Frameworks: " + _choices(FRAMEWORKS) + ". Data sets: " + _choices(DATASETS) + ".",
        "", _table(["workload", "data sets (first: default)", "loss", "model"], workloads)])


# ---------------------------------------------------------------------------------------
# Results format

MICRO_DESCRIPTIONS = {"wave": "the wave (the step)", "micro_batch": "the micro-batch",
                      "backward": "false: forward, true: backward",
                      "begin_ns": "begins", "end_ns": "ends",
                      "stretch_ns": "emulated slowdown inside it", "rank": "the stage's worker"}
BUCKET_DESCRIPTIONS = {"rank": "the worker", "step": "the step", "bucket": "DDP's bucket index",
                       "bytes": "the bucket's gradients, in bytes",
                       "ready_ns": "the backward handed it to its all-reduce",
                       "reduced_ns": "its all-reduce was done (`comm_hook = \"timed\"`; "
                                     "0: not recorded)"}
# constant -> what the file holds; the constant's module is where its name comes from
FILE_CONSTANTS: list[tuple[Any, str, str]] = [
    (manifest, "MANIFEST_FILE", "the run's metadata (fields below)"),
    (rundir, "RUN_FILE", "`{suite, run}`: the configuration the workers and servers read"),
    (collector, "STEPS_FILE", "one row per (worker, step): the record fields below"),
    (collector, "TRACE_FILE", "Chrome trace events"),
    (collector, "EVAL_FILE", "held-out evaluations (`eval_every`)"),
    (collector, "MICRO_FILE", "pipelined runs: every micro-batch's forward and backward"),
    (collector, "BUCKETS_FILE", "`ddp` runs: every gradient bucket's hand-over and all-reduce"),
    (sampler, "SYSTEM_FILE", "the launcher's samples of the host's CPU (local runs)"),
    (collector, "PARTS_DIR", "records as flushed while running, kept"),
    (collector, "CLOCK_PART", "in parts/: clock offsets to rank 0"),
    (collector, "PARTITION_LOG", "in parts/: rank 0's partition history and standalone "
                                 "rates so far"),
    (collector, "EVAL_PART", "in parts/: rank 0's held-out evaluations so far, a JSON "
                             "object a line"),
    (collector, "RESERVE_FILE", "while running: room to close the run on a full disk"),
]


def _dtype(kind: Any) -> str:
    return {"i": "int", "f": "float", "b": "bool", "u": "uint"}.get(kind.kind, kind.kind) + (
        "" if kind.kind == "b" else str(kind.itemsize * 8))


def side_table(dtype: Any, descriptions: dict[str, str]) -> str:
    """The columns of a side table's records (collector.SIDE_TABLES)."""
    return _table(["column", "dtype", "what"],
                  [[_code(n), _dtype(dtype[n]), descriptions.get(n, "")] for n in dtype.names])


def record_fields() -> list[tuple[str, str]]:
    """(name, dtype) of every field of a step record, in order."""
    dtype = collector.RECORD_DTYPE
    return [(name, _dtype(dtype[name])) for name in dtype.names]


def results_markdown() -> str:
    record = _table(["column", "dtype", "what"],
                    [[_code(n), t, step_fields.BY_NAME[n].description]
                     for n, t in record_fields()])
    identity = ", ".join(_code(c) for c in collector.IDENTITY_COLUMNS)
    micro_table = side_table(collector.MICRO_DTYPE, MICRO_DESCRIPTIONS)
    files = _table(["file", "constant", "what"],
                   [[_code(getattr(module, name)), _code(f"{module.__name__}.{name}"), what]
                    for module, name, what in FILE_CONSTANTS])
    kinds = {str: "string", int: "integer", bool: "boolean", dict: "object", list: "list",
             type(None): "null"}
    fields = _table(["field", "kinds", "required"],
                    [[_code(name), " or ".join(kinds.get(k, k.__name__) for k in types),
                      "yes" if required else "no"]
                     for name, (types, required) in manifest.FIELDS.items()])
    phases = ", ".join(_code(p.value) for p in collector.PHASES)
    return "\n".join([
        "### Files", "", files, "",
        f"### steps.parquet columns (`{collector.__name__}.RECORD_DTYPE`)", "",
        f"The phases, in the order a step runs them: {phases}; each has a `<phase>_ns` "
        "column. After the record's fields come the identity columns " + identity +
        " (which run, launch and repeat a row is from; `warmup`: a warm-up step), and "
        "`virtual_worker`, `stage` for pipelined runs.", "", record, "",
        f"### microbatches.parquet columns (`{collector.__name__}.MICRO_DTYPE`)", "",
        micro_table, "",
        f"### buckets.parquet columns (`{collector.__name__}.BUCKET_DTYPE`)", "",
        side_table(collector.BUCKET_DTYPE, BUCKET_DESCRIPTIONS), "",
        f"### manifest.json fields read strictly (`{manifest.__name__}.FIELDS`)", "",
        f"`schema_version` must be {hetbench.harness.SCHEMA_VERSION} (`hetbench.harness.SCHEMA_VERSION`); "
        f"`status` one of {_choices(manifest.STATUSES)}. A missing required field or a "
        "value of another kind is refused, naming the file.", "", fields, ""])


def job_markdown() -> str:
    """hetbench.Job's fields: their types and defaults from the dataclass, their meaning
    from FIELD_HELP beside it."""
    rows = []
    for f in dataclasses.fields(user_job.Job):
        default = "required" if f.default is dataclasses.MISSING else _code(f.default)
        rows.append([_code(f.name), _code(f.type), default, user_job.FIELD_HELP[f.name]])
    return "\n".join([
        f"From `{user_job.__name__}.Job` (`hetbench.Job`); a factory named by a suite's "
        "`workload` returns one.", "",
        _table(["field", "type", "default", "meaning"], rows), "",
        f"`reduction` is one of {_choices(user_job.REDUCTIONS)}. A factory's project folder "
        f"may not hold a module hetbench imports ({_choices(user_job.NEEDED_MODULES)}): it "
        "would shadow it, and the suite check names it.", ""])


LOOP_SOURCES = (ROOT / "harness" / "userloop" / "joining.py",
                ROOT / "harness" / "userloop" / "session.py")
LOOP_API = (("join", None), ("rank", "Session"), ("world_size", "Session"),
            ("is_main", "Session"), ("prepare", "Session"), ("backward", "Session"),
            ("finish", "Session"))


def loop_markdown() -> str:
    """hetbench.join and the Session's methods a loop calls: their signatures and docstrings
    read from the source with ast (importing it would load torch)."""
    found: dict[tuple[str, str | None], ast.FunctionDef] = {}
    for source in LOOP_SOURCES:
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                found[(node.name, None)] = node
            if isinstance(node, ast.ClassDef):
                found.update({(item.name, node.name): item for item in node.body
                              if isinstance(item, ast.FunctionDef)})
    names = " and ".join(f"`{s.relative_to(ROOT)}`" for s in LOOP_SOURCES)
    parts = [f"Generated from {names}.", ""]
    for name, owner in LOOP_API:
        node = found[(name, owner)]
        title = f"hetbench.{name}" if owner is None else f"{owner}.{name}"
        if any(ast.unparse(d) == "property" for d in node.decorator_list):
            signature = f"{title}: {ast.unparse(node.returns) if node.returns else 'Any'}"
        else:
            arguments = ast.unparse(node.args).removeprefix("self, ").removeprefix("self")
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            signature = f"{title}({arguments}){returns}"
        parts += [f"### `{title}`", "", "```python", signature, "```", "",
                  ast.get_docstring(node) or "", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------
# mkdocs events

MARKERS: dict[str, Callable[[], str]] = {
    "<!-- hetbench:cli -->": cli_markdown,
    "<!-- hetbench:suite-keys -->": suite_keys_markdown,
    "<!-- hetbench:builtin-suites -->": builtin_suites_markdown,
    "<!-- hetbench:catalogue -->": catalogue_markdown,
    "<!-- hetbench:results-format -->": results_markdown,
    "<!-- hetbench:job -->": job_markdown,
    "<!-- hetbench:loop -->": loop_markdown,
}
_expanded: set[str] = set()
DOCS = ROOT / "docs"
REGENERATE = "python docs/hooks/reference.py"


def _region(marker: str) -> re.Pattern[str]:
    """A marker's region in a page: the marker, the generated text, its closing marker
    (`<!-- /hetbench:NAME -->`); a marker without its closing one holds nothing yet."""
    closing = marker.replace("<!-- hetbench:", "<!-- /hetbench:")
    return re.compile("^" + re.escape(marker) + r"$(?:\n(.*?)^" + re.escape(closing) + "$)?",
                      re.S | re.M)


def held(markdown: str) -> list[str]:
    """The markers the page holds, each on a line of its own (one quoted in a sentence is
    not held)."""
    return [m for m in MARKERS if _region(m).search(markdown)]


def _generated(marker: str) -> str:
    closing = marker.replace("<!-- hetbench:", "<!-- /hetbench:")
    return f"{marker}\n{MARKERS[marker]().strip()}\n{closing}"


def _as_is(text: str, _: re.Match[str]) -> str:
    return text


def expanded(markdown: str) -> str:
    """The page with every region holding what the code generates now."""
    for marker in MARKERS:
        # a function, not the text itself: sub would read backslashes in it as escapes
        markdown = _region(marker).sub(functools.partial(_as_is, _generated(marker)), markdown)
    return markdown


def stale(markdown: str) -> list[str]:
    """The markers of the page whose region does not hold what the code generates now."""
    return [m for m in held(markdown)
            if any(found.group(0) != _generated(m) for found in _region(m).finditer(markdown))]


def pages() -> list[Path]:
    """The pages under docs/ that hold a marker."""
    return sorted(p for p in DOCS.rglob("*.md") if held(p.read_text()))


def on_pre_build(config: Any) -> None:
    _expanded.clear()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The site is built from the pages as committed: a region the code no longer
    matches fails the build (the page, read in the repository, would be wrong too)."""
    if found := stale(markdown):
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{page.file.src_uri}: {', '.join(found)} out of date with the "
                          f"code: run `{REGENERATE}` and commit the page")
    _expanded.update(held(markdown))
    return markdown


def on_post_build(config: Any) -> None:
    missing = sorted(set(MARKERS) - _expanded)
    if missing:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"docs/hooks/reference.py: no page holds {', '.join(missing)}")


def main(argv: list[str]) -> int:
    """`python docs/hooks/reference.py`: every page's regions written from the code (the
    pages changed are named); `--check`: only say which are out of date (exit 1)."""
    check = argv == ["--check"]
    out_of_date = []
    for page in pages():
        text = page.read_text()
        if stale(text):
            out_of_date.append(page)
            if not check:
                page.write_text(expanded(text))
    for page in out_of_date:
        print(f"{page.relative_to(ROOT)}: {'out of date' if check else 'written'}")
    return 1 if check and out_of_date else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
