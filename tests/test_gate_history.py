"""The regression gates' history (analysis/tables/gate_history.py): gates kept per commit,
chained by their commits, and a slowdown that creeps in a few percent a gate named. The
gates here are written by `entry` from paired comparisons of generated rounds
(tests/test_paired.py's), each commit a few percent slower than its parent."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hetbench.analysis.tables import gate_history
from hetbench.analysis.tables.paired import compare_paired
from hetbench.harness.cli.main import main
from tests.test_paired import gate_rounds

SUITE = "gen"


def gates_of(tmp_path: Path, factors: list[float], seed: int = 0) -> Path:
    """One gate per factor: commit c<i+1> against its parent c<i>, the current side's CPU
    time per sample that factor of the base's; all kept in one history folder."""
    history = tmp_path / "history"
    for i, factor in enumerate(factors):
        base, current = gate_rounds(tmp_path / f"gate-{i}", 8, seed=seed + i,
                                    current={"cpu_factor": (factor, factor)},
                                    loads=[0.0] * 8)
        kept = gate_history.entry(compare_paired(base, current), f"c{i + 1}", f"c{i}", SUITE,
                                  dirty=False)
        kept["time"] = f"2026-12-02T06:{i:02d}:00+00:00"  # one gate a minute, in order
        gate_history.write_entry(history, kept)
    return history


def test_a_slowdown_that_creeps_three_percent_a_gate_is_named(tmp_path: Path) -> None:
    history = gates_of(tmp_path, [1.03] * 5)
    entries = gate_history.read_history(history)
    assert [e["commit"] for e in entries] == [f"c{i}" for i in range(1, 6)]
    assert all(e["verdict"] != "regressed" for e in entries)  # each gate alone: within 5%
    gates = gate_history.chain(entries, SUITE, last=10)
    table = gate_history.drift(gates)
    cpu = table[(table["metric"] == "cpu_per_sample_us") & (table["worker"] == 1)]
    widest = cpu.sort_values("gates").iloc[-1]
    assert widest["gates"] == 5 and widest["since"] == "c0"
    assert widest["ratio"] == pytest.approx(1.03 ** 5, rel=0.03)
    assert widest["verdict"] == "regressed"
    found = gate_history.findings(table)
    assert any(line.startswith("pair worker 1: cpu_per_sample_us +") and "since c0" in line
               for line in found)


def test_unchanged_commits_show_no_drift(tmp_path: Path) -> None:
    history = gates_of(tmp_path, [1.0] * 5, seed=20)
    table = gate_history.drift(gate_history.chain(gate_history.read_history(history), SUITE,
                                                  last=10))
    assert len(table) and gate_history.findings(table) == []


def test_the_chain_ends_at_a_gap_in_the_commits_and_at_last(tmp_path: Path) -> None:
    history = gates_of(tmp_path, [1.0] * 4, seed=40)
    entries = gate_history.read_history(history)
    assert [g["commit"] for g in gate_history.chain(entries, SUITE, last=3)] == [
        "c2", "c3", "c4"]
    entries[1]["base"] = "elsewhere"  # c2 was gated against a commit no gate judged
    assert [g["commit"] for g in gate_history.chain(entries, SUITE, last=10)] == [
        "c2", "c3", "c4"]
    entries[2]["dirty"] = True  # c3's gate ran on a dirty tree: no commit's code
    assert [g["commit"] for g in gate_history.chain(entries, SUITE, last=10)] == ["c4"]
    assert gate_history.chain(entries, "another suite", last=10) == []


def test_a_kept_gate_holds_each_gate_rows_log_ratio_and_half_width(tmp_path: Path) -> None:
    base, current = gate_rounds(tmp_path, 6, seed=60, current={"cpu_factor": (1.2, 1.2)})
    comparison = compare_paired(base, current)
    kept = gate_history.entry(comparison, "abc", "def", SUITE, dirty=False)
    gate_rows = comparison.table[comparison.table["role"] == "gate"]
    assert len(kept["rows"]) == len(gate_rows) == 4
    for row, (_, r) in zip(kept["rows"], gate_rows.iterrows(), strict=True):
        assert math.exp(row["log_ratio"]) == pytest.approx(r["ratio"])
        assert math.exp(row["log_ratio"] + row["half_width"]) == pytest.approx(r["ci_high"])
        assert row["level"] == pytest.approx(1 - 0.05 / 4)


def test_unreadable_files_in_the_history_are_skipped(tmp_path: Path) -> None:
    history = gates_of(tmp_path, [1.0, 1.0], seed=80)
    (history / "notes.json").write_text("not json")
    (history / "other.json").write_text('{"schema": 99}')
    assert len(gate_history.read_history(history)) == 2


def test_ci_history_last_below_two_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    status = main(["ci", "--base", "HEAD", "--history", str(tmp_path / "h"),
                   "--history-last", "1", "--out", str(tmp_path / "ci")])
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--history-last" in err[0]
    assert not (tmp_path / "ci").exists() and not (tmp_path / "h").exists()
