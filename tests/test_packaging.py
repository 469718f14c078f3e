"""hetbench installs under one import name (issue 56): a user's project may have its own
`analysis/`, `workloads/`, `harness/` or `adapters/` on the import path beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from hetbench.harness.system.environment import git_commit
from tests.conftest import REPO, Spawn

ROOMS = ("harness", "adapters", "workloads", "analysis")


def test_the_wheel_holds_the_package_hetbench_and_nothing_else(tmp_path: Path,
                                                                spawn: Spawn) -> None:
    # From a copy of what the wheel is built from: setuptools packs whatever its build/ folder
    # holds, stale modules of an earlier build included.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("hetbench", *ROOMS):
        shutil.copytree(REPO / name, source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    done = spawn.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                      "--quiet", "--wheel-dir", str(tmp_path), str(source)],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("hetbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"hetbench", wheel.name.split("-py")[0]
                                                + ".dist-info"}
    for room in ROOMS:  # each room's modules, under hetbench/
        assert f"hetbench/{room}/__init__.py" in names
    # the package data: built-in suites, device profiles, the number-word corpus
    assert "hetbench/harness/spec/suites/quick.toml" in names
    assert any(n.startswith("hetbench/analysis/profiles/") and n.endswith(".json") for n in names)
    assert "hetbench/workloads/numbers.npz" in names


def test_a_project_with_packages_of_the_rooms_names_keeps_them(tmp_path: Path,
                                                               spawn: Spawn) -> None:
    for room in ROOMS:
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text(f"OWNER = 'the project {room}'\n")
    code = ("import importlib, sys\n"
            f"for room in {ROOMS!r}:\n"
            "    assert importlib.import_module(room).OWNER == f'the project {room}', room\n"
            "import hetbench.harness.cli.main, hetbench.analysis.metrics\n"
            "import hetbench.workloads, hetbench.adapters\n"
            "assert hetbench.workloads.get_workload('mlp') is not None\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(" + repr(ROOMS) + ")))\n")
    # The project's folder first on the path, as `python -c` and hetbench's own import of a
    # user's factory put it; outside the checkout, so only the installed hetbench is seen.
    done = spawn.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                     timeout=120, env=environment_without_pythonpath())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == repr(sorted(ROOMS))  # only the project's own


def test_installing_hetbench_claims_none_of_the_rooms_names(tmp_path: Path,
                                                            spawn: Spawn) -> None:
    code = ("import importlib.util\n"
            f"print([r for r in {ROOMS!r} if importlib.util.find_spec(r) is not None])\n"
            "print(importlib.util.find_spec('hetbench') is not None)\n")
    done = spawn.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                     timeout=60, env=environment_without_pythonpath())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]", "True"]


def environment_without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_checkout_imports_as_an_install_does() -> None:
    """hetbench/<room> links to the room's folder: `hetbench ci`'s base worktree runs its own
    code through them."""
    for room in ROOMS:
        link = REPO / "hetbench" / room
        assert link.is_symlink() and link.resolve() == (REPO / room).resolve(), room
    done = subprocess.run(["git", "-C", str(REPO), "ls-files", "-s", "hetbench"],
                          capture_output=True, text=True, timeout=30)
    modes = {line.split()[3]: line.split()[0] for line in done.stdout.splitlines()}
    if modes:  # committed: as links (mode 120000), not copies
        assert all(modes.get(f"hetbench/{room}") == "120000" for room in ROOMS), modes


def test_a_run_records_the_commit_of_the_checkout_it_runs_from() -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, timeout=30).stdout.strip()
    assert git_commit()["commit"] == head
