"""`hetbench report` and `hetbench figures` on run directories as hetbench writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli.main import main
from tests.synthetic import steps_frame, write_run

FIGURES = ("compute_per_step", "idle_ecdf", "phase_breakdown", "straggler_causes", "what_if",
           "cv_by_group")


@pytest.fixture
def suite_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / "synthetic"
    for repeat in range(3):
        frame = steps_frame(40, lambda r, s, k=repeat: [2.0, 4.0 + 0.2 * k + (s % 7 == 0)][r])
        write_run(folder, frame, name="pair", repeat=repeat, slowdown=(1.0, 2.0),
                  standalone=[{"rank": 0, "samples_per_s": 16e3},
                              {"rank": 1, "samples_per_s": 8e3}])
    # A run that failed after 15 of its 40 steps.
    write_run(folder, steps_frame(15, lambda r, s: 2.0), name="broken", status="failed",
              planned_steps=40)
    return folder


def test_report_writes_markdown_and_figures(suite_folder: Path, capsys) -> None:
    assert main(["report", str(suite_folder)]) == 0
    out = capsys.readouterr().out
    assert "pair: variability costs" in out and "3 repeats" in out
    report_dir = suite_folder / "report"
    text = (report_dir / "report.md").read_text()
    assert "| step | worker 0 | worker 1 |" in text
    assert "| broken-r0 | failed | True |" in text  # partial runs are reported, and marked
    assert "Straggler excess" in text and "What-if" in text
    for name in FIGURES:
        assert (report_dir / f"{name}.png").stat().st_size > 1000
        assert f"![{name}.png]({name}.png)" in text


def test_report_compares_aggregation_strategies(tmp_path: Path, capsys) -> None:
    """Runs with a native strategy get a table of communication time per strategy:
    median and p95 of reduced - arrival, idle excluded."""
    folder = tmp_path / "strategies"
    for repeat in range(2):
        for strategy, comm_ms in (("torch", 0.5), ("mxnet-kvstore", 2.0)):
            frame = steps_frame(30, lambda r, s: [2.0, 3.0][r], comm_ms=comm_ms)
            write_run(folder, frame, name=strategy, repeat=repeat, strategy=strategy)
    assert main(["report", str(folder), "--no-figures"]) == 0
    text = (folder / "report" / "report.md").read_text()
    section = text.split("## Communication by aggregator")[1].split("##")[0]
    rows = {line.split("|")[2].strip(): line for line in section.splitlines()
            if line.startswith("| pytorch")}
    assert set(rows) == {"torch", "mxnet-kvstore"}
    cells = {name: [c.strip() for c in line.split("|")] for name, line in rows.items()}
    assert cells["torch"][3] == "2" and cells["mxnet-kvstore"][3] == "2"  # repeats
    assert "0.5" in cells["torch"][4:6] and "2" in cells["mxnet-kvstore"][4:6]
    # the variability of the setups side by side: one column per aggregation strategy
    setups = text.split("## By framework, aggregation")[1].split("##")[0]
    header = next(line for line in setups.splitlines() if line.startswith("| metric"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["metric", "mxnet-kvstore",
                                                                 "torch"]
    idle = next(line for line in setups.splitlines() if line.startswith("| idle_fraction"))
    assert idle.count("[") == 2  # mean [95% interval] for each


def test_figures_command_writes_png_and_pdf(suite_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "figs"
    assert main(["figures", str(suite_folder / "pair-r0"), "--out", str(out)]) == 0
    for name in FIGURES:
        assert (out / f"{name}.png").is_file() and (out / f"{name}.pdf").is_file()
        pdf = (out / f"{name}.pdf").read_bytes()
        # fonts embedded as TrueType, not Type 3 (journals' submission checks refuse those)
        assert b"/Type3" not in pdf
        assert b"/CIDFontType2" in pdf or b"/TrueType" in pdf


def test_a_folder_without_runs_is_one_clear_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a run directory" in err


def test_an_unknown_schema_is_refused(suite_folder: Path, capsys) -> None:
    path = suite_folder / "pair-r0" / "manifest.json"
    meta = json.loads(path.read_text())
    meta["schema_version"] = 99
    path.write_text(json.dumps(meta))
    assert main(["report", str(suite_folder / "pair-r0")]) == 2
    err = capsys.readouterr().err.strip()
    assert "schema_version 99 is not supported" in err and err.count("\n") == 0
