"""Issue 31, part 7: the terminal report fits 100 columns, headline first, and `--format
json` prints the same headline and tables for scripts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from hetbench.analysis.render.terminal import WIDTH, Summary, Table, as_data, fit, render
from hetbench.harness.cli.main import main
from tests.synthetic import steps_frame, write_run


def wide_table() -> Table:
    """Two runs, ten metrics each 13 characters wide, one column empty, one with intervals."""
    frame = pd.DataFrame({"run": ["a-long-run-name", "b"], "repeats": [3, 1]})
    for k in range(10):
        frame[f"metric_{k:02d}_name"] = [1234.5678 * (k + 1), 0.5]
    frame["empty"] = [math.nan, math.nan]
    frame["metric_00_name ±95%"] = [12.345, math.nan]
    return Table("Wide", frame)


def test_a_wide_table_is_split_into_parts_that_repeat_the_key_column() -> None:
    lines = fit(wide_table())
    assert lines[0] == "Wide"
    assert all(len(line) <= WIDTH for line in lines)
    headers = [line for line in lines if line.startswith("run ")]
    assert len(headers) >= 2  # split, each part named by its run column
    shown = " ".join(headers)
    assert all(f"metric_{k:02d}_name" in shown for k in range(10))
    assert "empty" not in shown and "±95%" not in shown  # no values; merged into its metric
    first_rows = [line for line in lines if line.startswith("a-long-run-name")]
    assert first_rows[0].split()[1:3] == ["3", "1.23e+03"]  # numbers right, 3 digits
    assert "1.23e+03 ± 12.3" in first_rows[0]  # the mean and its half-interval
    assert all(line.startswith(("a-long-run-name", "b ")) for line in
               (line for line in lines[1:] if line and not line.startswith("run ")))


def test_text_columns_are_left_aligned_and_long_cells_are_cut() -> None:
    frame = pd.DataFrame({"run_id": ["x", "y"], "detected": ["short", "z" * 150]})
    lines = fit(Table("Detections", frame, ("run_id",)), width=60)
    assert lines[2].startswith("x") and "short" in lines[2]
    assert lines[2].rstrip().endswith("short") and lines[2].index("short") == 8
    assert len(lines[3]) == 60 and lines[3].endswith("…")


def test_render_puts_the_headline_first_and_wraps_it() -> None:
    summary = Summary(headline=["word " * 40])
    summary.add(wide_table())
    summary.add(Table("Nothing", pd.DataFrame()))  # an empty table is left out
    text = render(summary)
    lines = text.splitlines()
    assert lines[0].startswith("word word") and lines[1].startswith("  word")
    assert "Nothing" not in text and "Wide" in text
    assert max(len(line) for line in lines) <= WIDTH


def test_the_json_form_holds_every_column_unformatted() -> None:
    summary = Summary(headline=["h"], tables=[wide_table()])
    data = json.loads(json.dumps(as_data(summary)))
    rows = data["tables"][0]["rows"]
    assert data["headline"] == ["h"] and data["tables"][0]["keys"] == ["run"]
    assert rows[0]["metric_09_name"] == 12345.678 and rows[0]["metric_00_name ±95%"] == 12.345
    assert rows[1]["empty"] is None and rows[1]["repeats"] == 1


def test_report_format_json_prints_the_same_summary(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "results" / "synthetic"
    for repeat in range(2):
        write_run(folder, steps_frame(30, lambda r, s, k=repeat: [2.0, 4.0 + k][r]),
                  name="pair", repeat=repeat, slowdown=(1.0, 2.0))
    assert main(["report", str(folder), "--no-figures"]) == 0
    text = capsys.readouterr().out
    assert main(["report", str(folder), "--no-figures", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)  # nothing else on stdout
    summary = data["synthetic"]
    assert summary["headline"][0] == "2 run(s): 1 configuration(s) x 2 repeat(s)."
    assert text.startswith(summary["headline"][0])
    assert summary["report"] == str(folder / "report" / "report.md")
    throughput = summary["tables"][0]
    assert throughput["title"] in text
    row = throughput["rows"][0]
    assert row["run"] == "pair" and row["repeats"] == 2
    assert f"{row['samples_per_s']:.3g} ± {row['samples_per_s ±95%']:.3g}" in text
