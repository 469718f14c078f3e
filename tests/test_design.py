"""docs/DESIGN.md stays true to the tree: every path and module it names exists, and its
tables of harness/'s and analysis/'s rooms list every module of each room and no other."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

DESIGN = REPO / "docs" / "DESIGN.md"
TOP = ("harness", "adapters", "workloads", "analysis", "tests", "benchmarks", "docs")
# harness/loop/worker.py, analysis/models/profiles/*.json, benchmarks/gpu_check.sh, ...
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[\w./*-]*\w)")
ROOMS = "harness|adapters|workloads|analysis"
MODULE = re.compile(rf"(?<![\w.])(hetbench\.(?:{ROOMS})(?:\.\w+)*)")
# a room's module named without `hetbench.`: no longer an import name (issue 56)
BARE_MODULE = re.compile(rf"`((?:{ROOMS})\.\w+(?:\.\w+)*)")
ROOM_ROW = re.compile(r"^\| `(\w+)/` \| [^|]+ \| (.+) \|$", re.M)
ANALYSIS_ROW = re.compile(r"^\| `analysis/(\w+)/` \| [^|]+ \| (.+) \|$", re.M)


def named_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in PATH.findall(text)}


def exists(path: str) -> bool:
    if "*" in path:
        return any(REPO.glob(path))
    return (REPO / path).exists()


def module_exists(dotted: str) -> bool:
    """A module, a package, or a name defined at the top of one
    (hetbench.harness.cli.main.entry)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if not base.is_dir() else base / "__init__.py"
        if module.exists():
            rest = parts[cut:]
            if not rest:
                return True
            return re.search(rf"^(?:def|class) {rest[0]}\b|^{rest[0]}\b.*=",
                             module.read_text(), re.M) is not None
    return False


def test_every_path_design_names_exists() -> None:
    text = DESIGN.read_text()
    missing = sorted(p for p in named_paths(text) if not exists(p))
    assert not missing, f"DESIGN.md names paths that do not exist: {missing}"


def test_every_module_design_names_exists() -> None:
    text = DESIGN.read_text()
    missing = sorted(m for m in set(MODULE.findall(text)) if not module_exists(m))
    assert not missing, f"DESIGN.md names modules that do not exist: {missing}"


def test_design_names_modules_by_their_import_name() -> None:
    bare = sorted(set(BARE_MODULE.findall(DESIGN.read_text())))
    assert not bare, f"DESIGN.md names modules without `hetbench.`: {bare}"


def rooms_listed(rows: dict[str, str], top: str) -> None:
    rooms = sorted(p.name for p in (REPO / top).iterdir()
                   if p.is_dir() and (p / "__init__.py").exists())
    assert sorted(rows) == rooms
    for room, cell in rows.items():
        listed = set(re.findall(r"`(\w+\.py)`", cell))
        present = {p.name for p in (REPO / top / room).glob("*.py")} - {"__init__.py"}
        if room != "exchange":  # the exchange's __init__ holds its Protocol: listed
            listed.discard("__init__.py")
        else:
            present.add("__init__.py")
        assert listed == present, (room, sorted(listed ^ present))


def test_the_rooms_table_lists_each_room_exactly() -> None:
    rooms_listed(dict(ROOM_ROW.findall(DESIGN.read_text())), "harness")


def test_the_analysis_rooms_table_lists_each_room_exactly() -> None:
    rooms_listed(dict(ANALYSIS_ROW.findall(DESIGN.read_text())), "analysis")


def test_the_checks_catch_a_wrong_name(tmp_path: Path) -> None:
    text = "see `harness/loop/nothing.py` and hetbench.harness.loop.worker.no_such_name"
    assert [p for p in named_paths(text) if not exists(p)] == ["harness/loop/nothing.py"]
    assert not module_exists("hetbench.harness.loop.worker.no_such_name")
    assert module_exists("hetbench.harness.loop.trainer.Trainer")
    assert module_exists("hetbench.harness.cli.main.entry")
