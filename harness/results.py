"""Reading run directories back: manifest (schema-checked) and step records."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness import collector, manifest
from harness.errors import UsageError


@dataclass(frozen=True)
class RunData:
    run_dir: Path
    manifest: dict[str, Any]
    steps: pd.DataFrame
    evals: pd.DataFrame  # held-out evaluations (eval.parquet); empty without eval_every

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    @property
    def warmup_steps(self) -> int:
        return int(self.manifest["run"].get("warmup_steps", 0))


def load_run(run_dir: Path) -> RunData:
    """A run directory's manifest and steps; a run that never finalised is read from its
    flushed parts, so a crashed run still shows every step it recorded."""
    meta = manifest.read(run_dir)
    steps_file = run_dir / collector.STEPS_FILE
    if steps_file.is_file():
        try:
            steps = pd.read_parquet(steps_file)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
            raise UsageError(str(steps_file), f"unreadable: {exc}") from None
    else:
        steps = collector.records_frame(collector.read_parts(run_dir))
    for column, default in collector.EXCHANGE_DEFAULTS.items():
        if column not in steps.columns:  # recorded before aggregators: all-reduce steps
            steps[column] = default
    try:
        evals = collector.eval_frame(run_dir)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
        raise UsageError(str(run_dir / collector.EVAL_FILE), f"unreadable: {exc}") from None
    return RunData(run_dir, meta, steps, evals)


def writable_folder(path: Path, where: str) -> Path:
    """Create `path` if needed and check that files can be written in it, before anything
    runs: a bad --out is one line, not a traceback after the first run."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".hetbench-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(where, f"{path} is not a writable folder ({exc.strerror})") from None
    return path


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories named directly, or found below a suite or results folder (two
    levels down at most), in a stable order. A path with no run is an error."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UsageError(str(path), "no such file or directory")
        if (path / manifest.MANIFEST_FILE).is_file():
            found.append(path)
            continue
        below = sorted(p.parent for p in path.glob(f"*/{manifest.MANIFEST_FILE}"))
        below += sorted(p.parent for p in path.glob(f"*/*/{manifest.MANIFEST_FILE}"))
        if not below:
            raise UsageError(str(path), "not a run directory, and no run directories below it "
                             "(a run directory holds manifest.json)")
        found.extend(below)
    return list(dict.fromkeys(found))
