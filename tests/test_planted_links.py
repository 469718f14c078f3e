"""Files (issue 72): `--out`, and the suite's folder inside it, reached through a symbolic
link another user planted are refused by name, as if `fs.protected_symlinks` were on; a
link of the user's own is followed. Planting a link of another user's needs root
(lchown): elsewhere the tests skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetbench.harness.system.paths import foreign_link
from tests.conftest import Spawn, hetbench_command

NOBODY = 65534
SUITE = """
[suite]
name = "planted"

[[runs]]
name = "pair"
workload = "mlp"
steps = 4
global_batch = 32
workers = [ { threads = 1 }, { threads = 1 } ]
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link "
                                "needs root (lchown)")


def plant(link: Path, target: Path, owner: int = NOBODY) -> None:
    target.mkdir(exist_ok=True)
    link.symlink_to(target)
    os.lchown(link, owner, owner)


@needs_root
def test_an_out_planted_by_another_user_is_refused_and_nothing_lands_there(
        tmp_path: Path, spawn: Spawn) -> None:
    (tmp_path / "suite.toml").write_text(SUITE)
    theirs = tmp_path / "theirs"
    plant(tmp_path / "results", theirs)
    done = spawn.run(hetbench_command("run", "suite.toml", "--out", "results"), cwd=tmp_path,
                     capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{tmp_path / 'results'} is a symbolic link owned by another user (uid {NOBODY})" \
        in done.stderr, done.stderr
    assert list(theirs.iterdir()) == []  # it used to hold the run


@needs_root
def test_a_suite_folder_planted_in_a_shared_out_is_refused(tmp_path: Path,
                                                           spawn: Spawn) -> None:
    (tmp_path / "suite.toml").write_text(SUITE)
    shared = tmp_path / "shared"
    shared.mkdir()
    theirs = tmp_path / "theirs"
    plant(shared / "planted", theirs)
    done = spawn.run(hetbench_command("run", "suite.toml", "--out", str(shared)),
                     cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{shared / 'planted'} is a symbolic link owned by another user" in done.stderr
    assert list(theirs.iterdir()) == []


def test_a_link_of_ones_own_is_followed(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "results").symlink_to(tmp_path / "mine")
    assert foreign_link(tmp_path / "results" / "quick") is None
    assert foreign_link(tmp_path / "not-yet" / "there") is None


@needs_root
def test_a_planted_link_deep_in_the_path_is_found(tmp_path: Path) -> None:
    plant(tmp_path / "a", tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "b").mkdir()
    assert foreign_link(tmp_path / "a" / "b" / "c") == (tmp_path / "a", NOBODY)
