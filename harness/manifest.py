"""manifest.json: what was run, on what, how it ended. Written atomically, read strictly."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import SCHEMA_VERSION
from harness.errors import UsageError

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
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(str(path), f"unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise UsageError(str(path), "not a hetbench manifest (a JSON object is expected)")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UsageError(str(path), f"schema_version {version!r} is not supported "
                         f"(this hetbench reads {SCHEMA_VERSION})")
    if not isinstance(manifest.get("run"), dict):
        raise UsageError(str(path), "no run configuration (the 'run' object is missing)")
    return manifest


def update(run_dir: Path, **changes: Any) -> dict[str, Any]:
    manifest = json.loads((run_dir / MANIFEST_FILE).read_text())
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
