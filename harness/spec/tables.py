"""A run as the [[runs]] table a suite file gives it, and a suite written as TOML: what
`hetbench advise` writes, so that what it proposes is a suite `hetbench run` reads like any
other. Only what differs from the defaults is written; `parse_run` turns the table back
into the same RunSpec (tests/test_tables.py holds every built-in run to it). A pipelined
run's table is what a suite says (`virtual_workers` as the allocation that made them, or
the ranks; `pipeline` without the groups), not its spec's fields; its exchange follows from
the wave bound (pipelines.exchange_of), so no aggregator is written."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any

from hetbench.harness.spec.aggregators import AGGREGATORS, AggregatorSpec
from hetbench.harness.spec.loaders import LoaderSpec
from hetbench.harness.spec.loops import SCRIPT_DECIDES
from hetbench.harness.spec.optimizers import OptimizerSpec
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.harness.spec.pipelines import PipelineSpec
from hetbench.harness.spec.suite import RUN_DEFAULTS, RunSpec
from hetbench.harness.spec.workers import WorkerSpec

# the RunSpec fields written as they are when they differ from the suite defaults
_PLAIN = ("framework", "workload", "dataset", "steps", "warmup_steps", "global_batch", "lr",
          "seed", "timeout_s", "instrument", "calibrate", "calibrate_steps", "counters_every",
          "trace_steps", "size", "eval_every", "on_worker_failure", "interface", "placement",
          "keep_freed_memory", "gc", "batchnorm", "accumulate")


def run_table(run: RunSpec) -> dict[str, Any]:
    """The [[runs]] table that parse_run reads back as `run`."""
    out: dict[str, Any] = {"name": run.name}
    for key in _PLAIN:
        value = getattr(run, key)
        if value is None or (key in RUN_DEFAULTS and value == RUN_DEFAULTS[key]):
            continue
        if key == "dataset" and run.is_job:  # the factory's own data: no suite key
            continue
        if run.is_loop and key in SCRIPT_DECIDES:  # the script's own
            continue
        if key == "eval_every" and value == 0:
            continue
        out[key] = f"{value[0]}-{value[1]}" if key == "trace_steps" and isinstance(
            value, tuple) else value
    if run.project is not None:  # absolute: the table may be written to another folder
        out["project"] = run.project
    if run.script is not None:  # absolute, as `project`
        out["script"] = run.script
        if run.args:
            out["args"] = list(run.args)
    out["workers"] = [_worker(w, run.framework) for w in run.workers]
    if partition := _changed(run.partition, PartitionSpec()):
        out["partition"] = partition
    if run.pipeline is not None:  # its exchange follows from the wave bound
        out.update(_pipeline(run.pipeline))
    elif (aggregator := _aggregator(run.aggregator)) is not None:
        out["aggregator"] = aggregator
    if optimizer := _changed(run.optimizer, OptimizerSpec()):
        optimizer = {"name": run.optimizer.name, **optimizer}
        out["optimizer"] = optimizer if len(optimizer) > 1 else optimizer["name"]
    if run.target is not None:
        out["target"] = {"metric": run.target.metric, "value": run.target.value}
    if run.loader is not None:
        out["loader"] = _changed(run.loader, LoaderSpec(kind=""))
    if run.profile is not None:
        profile = run.profile
        out["profile"] = {"steps": f"{profile.first}-{profile.last}",
                          "ranks": list(profile.ranks) if profile.ranks is not None else "all"}
    return out


def _aggregator(spec: AggregatorSpec) -> Any:
    """Its name, or its name and the options it takes that differ; None: the default."""
    changed = _changed(spec, AggregatorSpec(name=""))
    if set(changed) - {"name"}:
        kind = AGGREGATORS[spec.name]
        return {k: v for k, v in changed.items() if k == "name" or k in kind.keys}
    return spec.name if spec.name != AggregatorSpec.name else None


def _pipeline(pipe: PipelineSpec) -> dict[str, Any]:
    """`virtual_workers` and `pipeline` as a suite gives them."""
    if pipe.allocation == "given":
        groups: Any = [list(g) for g in pipe.virtual_workers]
    else:
        groups = {"allocation": pipe.allocation, "size": len(pipe.virtual_workers[0])}
    table = {k: v for k, v in _changed(pipe, PipelineSpec(())).items()
             if k not in ("virtual_workers", "allocation")}
    return {"virtual_workers": groups, "pipeline": table}


def _changed(spec: Any, default: Any) -> dict[str, Any]:
    """The spec's fields that differ from `default`'s, tuples as lists."""
    return {f.name: list(v) if isinstance(v := getattr(spec, f.name), tuple) else v
            for f in fields(spec) if getattr(spec, f.name) != getattr(default, f.name)}


def _worker(worker: WorkerSpec, framework: str) -> dict[str, Any]:
    table = _changed(worker, WorkerSpec(framework=framework))
    if worker.slowdown_at is not None:
        table["slowdown_at"] = [list(p) for p in worker.slowdown_at]
    if worker.jitter is not None:
        table["jitter"] = {"probability": worker.jitter[0], "factor": worker.jitter[1]}
    return table


def suite_text(name: str, description: str, repeats: int, runs: list[dict[str, Any]],
               comment: str = "") -> str:
    """A suite file: [suite] and one [[runs]] table each, `comment` lines first."""
    lines = [f"# {line}" if line else "#" for line in comment.splitlines()]
    lines += ["[suite]", f"name = {toml_value(name)}", f"repeats = {repeats}",
              f"description = {toml_value(description)}"]
    for run in runs:
        lines += ["", "[[runs]]"] + [f"{key} = {toml_value(value)}" for key, value in run.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """A value as TOML writes it inline (strings, numbers, booleans, lists, tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} has no TOML form here")
    if isinstance(value, str | int | float):
        return json.dumps(value)  # a JSON string or number is a TOML one
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise ValueError(f"{value!r} has no TOML form")
