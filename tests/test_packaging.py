"""hetbench installs under one import name (issue 56): a user's project may have its own
`analysis/`, `workloads/`, `harness/` or `adapters/` on the import path beside it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hetbench.harness.system.environment import git_commit
from tests.conftest import REPO, Spawn

ROOMS = ("harness", "adapters", "workloads", "analysis")


def build_wheel(folder: Path, spawn: Spawn) -> Path:
    """hetbench's wheel, built in `folder` from a copy of what it is built from: setuptools
    packs whatever its build/ folder holds, stale modules of an earlier build included."""
    source = folder / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("hetbench", *ROOMS):
        shutil.copytree(REPO / name, source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    done = spawn.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                      "--quiet", "--wheel-dir", str(folder), str(source)],
                     cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = folder.glob("hetbench-*.whl")
    return wheel


def test_the_wheel_holds_the_package_hetbench_and_nothing_else(tmp_path: Path,
                                                                spawn: Spawn) -> None:
    wheel = build_wheel(tmp_path, spawn)
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"hetbench", wheel.name.split("-py")[0]
                                                + ".dist-info"}
    for room in ROOMS:  # each room's modules, under hetbench/
        assert f"hetbench/{room}/__init__.py" in names
    # the package data: built-in suites, device profiles, the number-word corpus
    assert "hetbench/harness/spec/suites/quick.toml" in names
    assert any(n.startswith("hetbench/analysis/models/profiles/") and n.endswith(".json")
               for n in names)
    assert "hetbench/workloads/numbers.npz" in names


def test_a_project_with_packages_of_the_rooms_names_keeps_them(tmp_path: Path,
                                                               spawn: Spawn) -> None:
    for room in ROOMS:
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text(f"OWNER = 'the project {room}'\n")
    code = ("import importlib, sys\n"
            f"for room in {ROOMS!r}:\n"
            "    assert importlib.import_module(room).OWNER == f'the project {room}', room\n"
            "import hetbench.harness.cli.main, hetbench.analysis.view.metrics\n"
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


def test_a_checkout_imports_as_an_install_does(spawn: Spawn) -> None:
    """hetbench/<room> links to the room's folder, committed as a link (mode 120000, not a
    copy): `hetbench ci`'s base worktree runs its own code through them."""
    for room in ROOMS:
        link = REPO / "hetbench" / room
        assert link.is_symlink() and link.resolve() == (REPO / room).resolve(), room
    done = spawn.run(["git", "-C", str(REPO), "ls-files", "-s", "hetbench"],
                     capture_output=True, text=True, timeout=30)
    modes = {line.split()[3]: line.split()[0] for line in done.stdout.splitlines()}
    assert all(modes.get(f"hetbench/{room}") == "120000" for room in ROOMS), modes


def test_a_run_records_the_commit_of_the_checkout_it_runs_from(spawn: Spawn) -> None:
    head = spawn.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                     text=True, timeout=30).stdout.strip()
    assert git_commit()["commit"] == head


GATE = """
[suite]
name = "gate"
[[runs]]
name = "pair"
workload = "userjob.models:make"
steps = 12
global_batch = 64
workers = [ { device = "cpu" }, { device = "cpu", slowdown = 2.0 } ]
"""


@pytest.mark.slow
@pytest.mark.long
def test_a_users_repository_is_studied_with_hetbench_installed_from_its_wheel(
        tmp_path: Path, spawn: Spawn) -> None:
    """A scratch project with its own analysis/, workloads/ and harness/ packages and a
    model module, in a git repository of two commits; hetbench installed from its wheel
    (not editable) in a fresh venv: init, run, report and ci --base HEAD~1 work from it."""
    from tests.test_jobs import MODELS

    wheel = build_wheel(tmp_path / "wheel", spawn)
    venv = tmp_path / "venv"
    done = spawn.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                     capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    site = Path(spawn.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True,
                          timeout=60).stdout.strip())
    # hetbench's dependencies from this environment, as a path (its .pth files, hetbench's
    # editable finder among them, are not read from there): only the wheel's hetbench
    (site / "dependencies.pth").write_text(str(Path(np.__file__).parents[1]) + "\n")
    done = spawn.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                      "--quiet", "--no-deps", str(wheel)], capture_output=True, text=True,
                     timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    project = tmp_path / "project"
    for package in ("userjob", *ROOMS[:3], "analysis"):
        (project / package).mkdir(parents=True, exist_ok=True)
        (project / package / "__init__.py").write_text(f"OWNER = 'project {package}'\n")
    (project / "userjob" / "models.py").write_text(MODELS)
    (project / "gate.toml").write_text(GATE)
    env = {**environment_without_pythonpath(), "GIT_AUTHOR_NAME": "t", "GIT_COMMITTER_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_EMAIL": "t@example.com"}

    def command(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        return spawn.run(list(args), cwd=project, env=env, capture_output=True, text=True,
                         timeout=timeout)

    hetbench = str(venv / "bin" / "hetbench")
    for git_args in (["init", "-q"], ["add", "."], ["commit", "-qm", "one"]):
        assert command("git", *git_args).returncode == 0
    (project / "userjob" / "models.py").write_text(MODELS.replace("nn.Linear(16, 16)",
                                                                  "nn.Linear(16, 16, bias=False)"))
    assert command("git", "commit", "-qam", "two").returncode == 0

    done = command(hetbench, "init", "userjob.models:make", "--steps", "10")
    assert done.returncode == 0, done.stderr
    assert (project / "hetbench.toml").is_file() and "4 runs of Tied" in done.stdout
    done = command(hetbench, "run", "hetbench.toml", "-k", "hetero-profiled", "--no-figures")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (project / "results" / "models").glob("hetero-profiled-r0-*")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["job"]["project"]["git"]["commit"] == command(
        "git", "rev-parse", "HEAD").stdout.strip()
    assert manifest["job"]["project"]["git"]["dirty"] is False  # results/ is untracked
    done = command(hetbench, "report", "results/models")
    assert done.returncode == 0, done.stderr
    assert "**Exactness**" in (project / "results" / "models" / "report" / "report.md"
                               ).read_text()
    done = command(hetbench, "ci", "--base", "HEAD~1", "--repeats", "1", "gate.toml",
                   "--out", "gate-results", timeout=600)
    assert done.returncode in (0, 3), done.stdout[-3000:] + done.stderr[-3000:]  # not failed
    base, current = (json.loads(next((project / "gate-results" / side / "gate").glob(
        "pair-*/manifest.json")).read_text()) for side in ("base", "current"))
    # the base ran the first commit's model (the mixer's bias), the current the second's
    assert base["job"]["parameters"] - current["job"]["parameters"] == 16
    assert base["job"]["project"]["folder"] != str(project)
