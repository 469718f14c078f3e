"""The figures' data (issue 17): the step timeline's spans, Choi's table and the stacked phase
bars, checked against step records whose answers are known by construction; and the files:
every figure at 300 dpi with TrueType fonts."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from hetbench.analysis.measures.timeline import batch_times, step_spans
from hetbench.analysis.render.figures import DPI, phase_frame, phase_stack, write_all
from hetbench.harness.records.results import Run
from tests.conftest import Spawn
from tests.synthetic import steps_frame, write_run

WARMUP = 2


def compute_ms(rank: int, step: int) -> float:
    """Worker 1 is the straggler, except at step 4 where worker 0 takes 6 ms."""
    if rank == 0:
        return 6.0 if step == 4 else 2.0
    return 3.5 if step == 5 else 3.0


@pytest.fixture
def steps() -> pd.DataFrame:
    return steps_frame(10, compute_ms)


def test_the_timeline_tiles_every_step_and_shows_who_waited_how_long(steps) -> None:
    spans = step_spans(steps, WARMUP, count=4)
    assert sorted(spans["step"].unique()) == [2, 3, 4, 5]  # after warm-up, consecutive
    assert spans["start_ms"].min() == 0.0  # from the window's first begin
    for (rank, step), part in spans.groupby(["rank", "step"]):
        row = steps[(steps["rank"] == rank) & (steps["step"] == step)].iloc[0]
        # the spans follow each other without gap and cover begin to end
        ends = (part["start_ms"] + part["duration_ms"]).to_numpy()
        assert part["start_ms"].to_numpy()[1:] == pytest.approx(ends[:-1])
        assert part["duration_ms"].sum() == pytest.approx((row.end_ns - row.begin_ns) / 1e6)
        idle = part.loc[part["phase"] == "idle", "duration_ms"].sum()
        waited = max(compute_ms(1 - rank, step) - compute_ms(rank, step), 0.0)
        assert idle == pytest.approx(waited)  # 1 ms mostly; worker 1 waits 3 ms at step 4
        assert part.loc[part["phase"] == "comm", "duration_ms"].sum() == pytest.approx(0.5)
    assert list(spans[(spans["rank"] == 1) & (spans["step"] == 3)]["phase"]) == [
        "forward", "backward", "comm", "apply"]  # no idle span for the straggler


def test_chois_table_holds_each_batch_time_and_its_straggler(steps) -> None:
    table, straggler = batch_times(steps, WARMUP, count=5)
    assert list(table.columns) == [2, 3, 4, 5, 6] and list(table.index) == [0, 1]
    for step in table.columns:
        for rank in table.index:
            assert table.loc[rank, step] == pytest.approx(compute_ms(rank, step))
    assert straggler.to_dict() == {2: 1, 3: 1, 4: 0, 5: 1, 6: 1}


def test_a_stacked_bar_is_the_workers_mean_step_with_idle_and_comm_apart(steps) -> None:
    manifest = {"run": {"name": "pair", "warmup_steps": WARMUP,
                        "workers": [{"device": "cpu"}, {"device": "cpu", "slowdown": 1.5}]}}
    stack = phase_stack(phase_frame(Run.of(manifest, steps)))
    assert list(stack.index) == ["0 cpu", "1 cpu-1.5x"]
    assert list(stack.columns) == ["forward", "backward", "idle", "comm", "apply"]
    after = steps[steps["step"] >= WARMUP]
    for rank, name in enumerate(stack.index):
        mine = after[after["rank"] == rank]
        assert stack.loc[name].sum() == pytest.approx(
            ((mine["end_ns"] - mine["begin_ns"]) / 1e6).mean())
        waited = [max(compute_ms(1 - rank, s) - compute_ms(rank, s), 0.0) for s in mine["step"]]
        assert stack.loc[name, "idle"] == pytest.approx(sum(waited) / len(waited))


def _png_dpi(path: Path) -> float:
    """Pixels per inch from the PNG's pHYs chunk (pixels per metre)."""
    data = path.read_bytes()
    at = data.index(b"pHYs") + 4
    per_metre, _, unit = struct.unpack(">IIB", data[at:at + 9])
    assert unit == 1  # metres
    return per_metre * 0.0254


def test_every_figure_is_written_at_300_dpi_with_truetype_fonts(tmp_path: Path, steps) -> None:
    runs = []
    for name in ("pair", "other"):
        run_dir = write_run(tmp_path / "runs", steps, name=name, slowdown=(1.0, 1.5))
        runs.append(Run.of(json.loads((run_dir / "manifest.json").read_text()), steps))
    paths = write_all(runs, tmp_path / "figures")
    names = {p.stem for p in paths}
    assert {"phase_breakdown", "what_if", "step_timeline", "batch_times", "heatmap"} <= names
    for path in paths:
        if path.suffix == ".png":
            assert _png_dpi(path) == pytest.approx(DPI, abs=1)
        else:
            assert b"/Type3" not in path.read_bytes()


def _outside_parts(layout: str | None) -> Any:
    """A figure with parts outside its axes, as the figures have them: a legend right of
    the panels and a title above (tight_layout, as most figures), or a colour bar that
    constrained layout places (the heatmap's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, axes = plt.subplots(2, 2, figsize=(6, 4), layout=layout)
    for i, ax in enumerate(axes.flat):
        if layout == "constrained":
            image = ax.imshow(np.arange(12.0).reshape(3, 4) * (i + 1), aspect="auto")
        else:
            ax.plot(range(50), np.sin(np.arange(50) / (i + 2)), label=f"worker {i}")
            ax.set_title(f"hetero-profiled r{i}", size=8)
    if layout == "constrained":
        figure.colorbar(image, ax=list(axes.flat), label="compute / worker's median")
    else:
        figure.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), title="worker")
        figure.tight_layout()
    figure.suptitle("Per-batch compute time per worker (2 run(s) of quick)", y=1.02)
    return figure


@pytest.mark.parametrize("layout", [None, "constrained"])
def test_a_figure_is_saved_in_the_box_savefig_finds_for_it(tmp_path: Path,
                                                           layout: str | None) -> None:
    """_save finds a figure's tight box once for its PNG and PDF: the PNG has the size that
    matplotlib's own bbox_inches="tight" gives the same figure, legend, title and colour bar
    inside it, and the PDF its size in points."""
    import re

    from PIL import Image

    from hetbench.analysis.render.figures import _save

    reference = tmp_path / "reference.png"
    _outside_parts(layout).savefig(reference, bbox_inches="tight", dpi=DPI)
    png, pdf = _save(_outside_parts(layout), tmp_path, "saved")
    expected = Image.open(reference).size
    width, height = Image.open(png).size
    assert abs(width - expected[0]) <= 1 and abs(height - expected[1]) <= 1, \
        ((width, height), expected)
    box = re.search(rb"/MediaBox \[\s*0 0 ([0-9.]+) ([0-9.]+)", pdf.read_bytes())
    assert box is not None
    assert float(box[1]) == pytest.approx(expected[0] / DPI * 72, abs=0.5)
    assert float(box[2]) == pytest.approx(expected[1] / DPI * 72, abs=0.5)


FILL_AND_SAVE = """
import io, os, sys
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from hetbench.analysis.render.figures import DPI, _save
disk, fail_on = Path(sys.argv[1]), sys.argv[2]
figure, ax = plt.subplots()
ax.plot(range(2000))
buffer = io.BytesIO()
figure.savefig(buffer, format="png", bbox_inches="tight", dpi=DPI)
page = 4096
# room for nothing, or for the PNG's pages and no more: the PDF after it fails
room = 0 if fail_on == "png" else -(-len(buffer.getvalue()) // page) * page
stat = os.statvfs(disk)
(disk / "filler").write_bytes(bytes(stat.f_bavail * stat.f_frsize - room))
try:
    _save(figure, disk, "f")
except OSError as exc:
    print("OSError", exc.errno, exc.filename)
"""


@pytest.mark.parametrize("fail_on", ["png", "pdf"])
def test_a_full_disk_is_an_os_error_naming_the_figure(tmp_path: Path, fail_on: str,
                                                       spawn: Spawn) -> None:
    """On a small tmpfs (its own user and mount namespace) filled to leave no room, or room
    for the PNG alone: whichever file the disk fills on, the error is an OSError naming it
    (matplotlib's PDF writer raises an AttributeError there)."""
    import sys

    from tests.conftest import REPO

    disk, program = tmp_path / "disk", tmp_path / "fill_and_save.py"
    disk.mkdir()
    program.write_text(FILL_AND_SAVE)
    script = (f"mount -t tmpfs -o size=1m full {disk} && "
              f"{sys.executable} {program} {disk} {fail_on}")
    done = spawn.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
    if "mount" in done.stderr and done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr[-2000:]
    kind, errno, filename = done.stdout.split()
    assert (kind, int(errno), filename) == ("OSError", 28, str(disk / f"f.{fail_on}"))


DRAW_BOTH_WAYS = """
import sys
from pathlib import Path
from hetbench.analysis.render.figures import write_all
from hetbench.harness.records.results import find_runs, load_run
runs = [load_run(p) for p in find_runs([Path(sys.argv[1])])]
told = []
paths = write_all(runs, Path(sys.argv[2]), told.append, processes=int(sys.argv[3]))
print("\\n".join(p.name for p in paths))
print("told", len(told))
"""


def test_groups_drawn_side_by_side_write_the_files_drawn_one_by_one(tmp_path: Path, steps,
                                                                     spawn: Spawn) -> None:
    """The groups of figures drawn in two forked processes (a process of its own: in
    pytest's, torch is loaded and drawing stays serial) are the same PNG files, byte for
    byte, in the same order, as those drawn one group after another."""
    import sys

    from tests.conftest import REPO

    for name in ("pair", "other"):
        write_run(tmp_path / "runs", steps, name=name, slowdown=(1.0, 1.5))
    program = tmp_path / "draw.py"
    program.write_text(DRAW_BOTH_WAYS)
    listed = {}
    for processes in (1, 2):
        done = spawn.run([sys.executable, str(program), str(tmp_path / "runs"),
                          str(tmp_path / f"p{processes}"), str(processes)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        listed[processes] = done.stdout.split("\n")
    assert listed[1] == listed[2] and "told 12" in listed[1]
    pngs = [name for name in listed[1] if name.endswith(".png")]
    assert len(pngs) >= 8, pngs
    for name in pngs:
        assert (tmp_path / "p1" / name).read_bytes() == (tmp_path / "p2" / name).read_bytes(), \
            name


GROUPS_WHERE_DRAWN = """
import os, sys, time
from pathlib import Path
from hetbench.analysis.render import drawing
def group(index):
    def where():
        time.sleep(0.3)  # long enough that both processes take groups
        if index == 2 and sys.argv[1] == "fail":
            raise OSError(28, "No space left on device", f"figure{index}.png")
        return [Path(f"{index}-{os.getpid()}")]
    return (f"group {index}", where)
try:
    paths = drawing.draw([group(i) for i in range(6)], processes=2)
    print(os.getpid(), " ".join(p.name for p in paths))
except OSError as exc:
    print("OSError", exc.errno, exc.filename)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one usable core: no side by side")
def test_groups_are_drawn_in_other_processes_in_order_and_raise_as_drawn(
        tmp_path: Path, spawn: Spawn) -> None:
    import sys

    from tests.conftest import REPO

    program = tmp_path / "where.py"
    program.write_text(GROUPS_WHERE_DRAWN)
    done = spawn.run([sys.executable, str(program), "draw"], cwd=REPO, capture_output=True,
                     text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    parent, *drawn = done.stdout.split()
    assert [name.split("-")[0] for name in drawn] == [str(i) for i in range(6)]
    pids = {name.split("-")[1] for name in drawn}
    assert parent not in pids and 1 < len(pids) <= 2, (parent, pids)
    done = spawn.run([sys.executable, str(program), "fail"], cwd=REPO, capture_output=True,
                     text=True, timeout=120)
    assert done.stdout.split() == ["OSError", "28", "figure2.png"], done.stderr[-2000:]
