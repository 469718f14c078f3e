"""manifest.json: what was run, on what, how it ended. Written atomically, read strictly."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hetbench.harness import SCHEMA_VERSION
from hetbench.harness.records import jsonfile
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import NAME_PATTERN

MANIFEST_FILE = "manifest.json"
STATUSES = ("running", "completed", "failed", "interrupted", "skipped")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def write(run_dir: Path, manifest: dict[str, Any]) -> None:
    tmp = run_dir / f".{MANIFEST_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str))
    tmp.replace(run_dir / MANIFEST_FILE)


def read(run_dir: Path) -> dict[str, Any]:
    path = run_dir / MANIFEST_FILE
    if not path.is_file():
        raise UsageError(str(run_dir), "not a run directory (no manifest.json)")
    manifest = jsonfile.read(path, "manifest")
    if not isinstance(manifest, dict):
        raise UsageError(str(path), "not a hetbench manifest (a JSON object is expected)")
    version = manifest.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise UsageError(str(path), f"schema_version {version!r} is not supported "
                         f"(this hetbench reads {SCHEMA_VERSION})")
    problem = schema_problem(manifest)
    if problem:
        raise UsageError(str(path), problem)
    return manifest


# What readers rely on, by dotted name: the kinds a value may have, and whether it must be
# there. A damaged or hand-edited manifest is refused by field rather than reported wrongly
# (a bool is not an integer here, as JSON tells them apart).
FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "run_id": ((str,), True),
    "suite": ((dict,), True),
    "suite.name": ((str,), True),
    "run": ((dict,), True),
    "run.name": ((str,), True),
    "run.steps": ((int,), False),
    "run.warmup_steps": ((int,), False),
    "run.global_batch": ((int,), False),
    "run.instrument": ((bool,), False),
    "run.workers": ((list,), False),
    "run.partition": ((dict,), False),
    "run.aggregator": ((dict, type(None)), False),
    "repeat": ((int,), True),
    "status": ((str,), True),
    "reason": ((str,), False),
    "heterogeneity": ((str,), False),
    "environment": ((dict,), False),
    "workers": ((list,), True),
    "standalone": ((list,), False),
    "partition_history": ((list,), False),
    "launcher": ((dict,), False),
    "launcher.host": ((str,), True),
    "launcher.pid": ((int,), True),
    "launcher.started": ((int, type(None)), True),
    "load": ((dict, type(None)), False),
    "clock": ((dict, type(None)), False),
    "pipeline": ((dict,), False),
    "pipeline.virtual_workers": ((list,), True),
}
# suite and run names (NAME_PATTERN) are the folders a run directory's path is made of: the
# spec checks them on the way in; a hand-edited manifest must not lead `report` out of --out
PATH_NAMES = ("suite.name", "run.name")
NON_NEGATIVE = ("run.steps", "run.warmup_steps", "run.global_batch", "repeat", "launcher.pid")
LISTS_OF_OBJECTS = ("run.workers", "workers", "partition_history", "standalone")
KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "an object",
              list: "a list", type(None): "null"}
MISSING = object()


def schema_problem(manifest: dict[str, Any]) -> str:
    """What is wrong with the manifest's fields ("" when nothing): the first field that is
    missing or of the wrong kind. A field inside an optional object absent is no problem."""
    for name, (kinds, required) in FIELDS.items():
        parent, _, _ = name.rpartition(".")
        if parent and not isinstance(_lookup(manifest, parent), dict):
            continue  # an optional object left out (a missing required one is named above)
        value = _lookup(manifest, name)
        if value is MISSING:
            if required:
                return f"{name} is missing"
            continue
        if not any(_is_kind(value, kind) for kind in kinds):
            expected = " or ".join(KIND_NAMES[k] for k in kinds)
            return f"{name} is {_shown(value)} ({expected} is expected)"
        if name in NON_NEGATIVE and value < 0:
            return f"{name} is {value} (a number >= 0 is expected)"
        if name in LISTS_OF_OBJECTS and not all(isinstance(v, dict) for v in value):
            return f"{name} holds {_shown(next(v for v in value if not isinstance(v, dict)))} " \
                   "(a list of objects is expected)"
    for name in PATH_NAMES:  # readers make folders of them: no "..", no "/"
        if not NAME_PATTERN.fullmatch(value := _lookup(manifest, name)):
            return f"{name} is {_shown(value)} (letters, digits and ._- are expected)"
    if manifest["status"] not in STATUSES:
        return f"status is {_shown(manifest['status'])} (allowed: {', '.join(STATUSES)})"
    return ""


def _lookup(manifest: dict[str, Any], name: str) -> Any:
    value: Any = manifest
    for key in name.split("."):
        if not isinstance(value, dict) or key not in value:
            return MISSING
        value = value[key]
    return value


def _is_kind(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def update(run_dir: Path, **changes: Any) -> dict[str, Any]:
    manifest = jsonfile.read(run_dir / MANIFEST_FILE, "manifest")
    manifest.update(changes)
    write(run_dir, manifest)
    return manifest


def new(suite: dict[str, Any], run: dict[str, Any], repeat: int, run_id: str,
        environment: dict[str, Any], heterogeneity: str) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "suite": suite,
        "run": run,
        "repeat": repeat,
        "heterogeneity": heterogeneity,
        "status": "running",
        "reason": "",
        "start": now_iso(),
        "end": None,
        "environment": environment,
        "workers": [],
    }
