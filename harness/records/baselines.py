"""The committed baselines over the repository's history: each commit that changed
results/baselines/ci, its runs read back from git, for the regression history of the HTML
report (as asv's published pages plot a benchmark over commits).

Only a hetbench checkout with git has them; an installed package has no history to read."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BASELINE_DIR = "results/baselines/ci"
GIT_TIMEOUT_S = 60
MAX_SNAPSHOTS = 30  # the newest commits that changed the baselines


@dataclass(frozen=True)
class Snapshot:
    commit: str
    date: str  # the commit date, YYYY-MM-DD
    subject: str
    folder: Path  # the baselines as that commit held them, extracted


def checkout_root() -> Path | None:
    """The git checkout hetbench runs from, or None (an installed package)."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / ".git").exists() else None


def _git(root: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True,
                          timeout=GIT_TIMEOUT_S).stdout


@contextmanager
def snapshots(root: Path | None = None, folder: str = BASELINE_DIR) -> Iterator[list[Snapshot]]:
    """Each commit that changed `folder` (newest last, at most MAX_SNAPSHOTS), its files
    extracted to a temporary folder removed on exit. Empty without git or baselines."""
    root = root or checkout_root()
    if root is None:
        yield []
        return
    with tempfile.TemporaryDirectory(prefix="hetbench-baselines-") as tmp:
        found: list[Snapshot] = []
        try:
            log = _git(root, "log", f"-n{MAX_SNAPSHOTS}", "--format=%H%x09%cs%x09%s", "--",
                       folder).decode()
            for line in reversed(log.splitlines()):
                commit, date, subject = line.split("\t", 2)
                target = Path(tmp) / commit
                with tarfile.open(fileobj=io.BytesIO(_git(root, "archive", commit, folder))) \
                        as archive:
                    _extract(archive, target)
                if (target / folder).is_dir():  # a commit that removed them has none
                    found.append(Snapshot(commit, date, subject, target / folder))
        except (OSError, subprocess.SubprocessError, tarfile.TarError):
            found = []  # no git here, or not a repository: no history to show
        yield found


def _extract(archive: tarfile.TarFile, target: Path) -> None:
    """Regular files and folders under `target` only: tarfile's "data" filter where this
    Python has it (3.11.4 and later), else the same check by hand."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(target, filter="data")
        return
    for member in archive.getmembers():
        inside = (target / member.name).resolve().is_relative_to(target.resolve())
        if not inside or not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"{member.name}: not a plain file inside the archive")
    archive.extractall(target)
