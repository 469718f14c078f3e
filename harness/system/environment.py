"""What the run ran on, for the manifest. Imports no framework: versions come from package
metadata, GPUs from nvidia-smi where it exists."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ("hetbench", "torch", "numpy", "pandas", "pyarrow", "psutil", "tensorflow-cpu",
             "tensorflow", "mxnet", "scikit-learn")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def gpus() -> list[dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    keys = ("index", "name", "driver", "memory")
    return [dict(zip(keys, (f.strip() for f in line.split(",")), strict=False))
            for line in out.splitlines() if line.strip()]


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_commit(source: Path | None = None) -> dict[str, Any]:
    """The commit of a folder's git checkout and whether its tracked files differ from it
    ({} outside one); by default hetbench's own source tree (harness/system/ is two folders
    below its top; installed from a wheel it is none, whatever holds site-packages)."""
    if source is None:
        source = Path(__file__).resolve().parents[2]
        if not (source / ".git").exists():
            return {}
    if shutil.which("git") is None:
        return {}
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "dirty": bool(dirty)} if commit else {}


def describe() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "memory_bytes": memory_bytes(),
        "gpus": gpus(),
        "python": sys.version.split()[0],
        "libraries": library_versions(),
        "git": git_commit(),
    }
