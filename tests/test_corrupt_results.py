"""Corrupt results get one line naming the file (issue 18), end to end through the
`hetbench` process: `report`, `compare` and `figures` refuse a damaged run directory with
exit status 2 and one line `hetbench: error: FILE: what is wrong`, never a traceback and
never a silently wrong report; runs still `running` and runs of several suites are never
pooled silently (a note each). No worker is started."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.harness.records import collector
from hetbench.harness.records.collector import RECORD_DTYPE, RECORD_FIELDS
from hetbench.harness.records.results import launcher_alive, load_run
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.system.procfs import start_ticks as process_start_ticks
from tests.conftest import Spawn
from tests.synthetic import steps_frame, write_run
from tests.trace_check import check_trace

TIMEOUT_S = 120
STEPS, WORLD = 12, 2




def error_line(result: subprocess.CompletedProcess[str], path: Path) -> str:
    """The one stderr line of the refusal, checked to name `path`."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hetbench: error: "), lines[0]
    assert str(path) in lines[0], lines[0]
    return lines[0]


def notes(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The stderr lines of a command that succeeded: notes only."""
    assert result.returncode in (0, 1, 3), result.stderr
    lines = result.stderr.splitlines()
    assert all(line.startswith("hetbench: note: ") for line in lines), result.stderr
    return lines


def compute_ms(rank: int, step: int) -> float:
    return [2.0, 3.0][rank]


def a_run(folder: Path, name: str = "pair", edit: Callable[[np.ndarray], None] | None = None,
          **kwargs: Any) -> Path:
    return write_run(folder, steps_frame(STEPS, compute_ms, edit=edit), name=name, **kwargs)


def edit_manifest(run_dir: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    path = run_dir / "manifest.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def row_of(records: np.ndarray, rank: int, step: int) -> np.ndarray:
    return records[step * WORLD + rank]  # steps_frame's records: step-major, then rank


def to_parts(run_dir: Path) -> None:
    """The run as one that never finalised: parts/rank<R>.bin, no steps.parquet."""
    steps = pd.read_parquet(run_dir / collector.STEPS_FILE)
    records = np.zeros(len(steps), dtype=RECORD_DTYPE)
    for field in RECORD_FIELDS:
        records[field] = steps[field].to_numpy()
    for rank in range(WORLD):
        collector.part_path(run_dir, rank).parent.mkdir(exist_ok=True)
        collector.part_path(run_dir, rank).write_bytes(records[records["rank"] == rank].tobytes())
    (run_dir / collector.STEPS_FILE).unlink()
    edit_manifest(run_dir, lambda m: m.update(status="failed", reason="killed"))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return a_run(tmp_path / "results" / "synthetic")


# -- manifest.json ---------------------------------------------------------------------------


def _delete(*keys: str) -> Callable[[dict[str, Any]], Any]:
    def change(meta: dict[str, Any]) -> None:
        for key in keys[:-1]:
            meta = meta[key]
        del meta[keys[-1]]
    return change


MANIFEST_CASES: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "run a string": (lambda m: m.update(run="pair"), "run is \"pair\" (an object is expected)"),
    "status a number": (lambda m: m.update(status=3), "status is 3 (a string is expected)"),
    "status unknown": (lambda m: m.update(status="done"), 'status is "done" (allowed: running'),
    "repeat a string": (lambda m: m.update(repeat="0"), "repeat is \"0\" (an integer"),
    "repeat a bool": (lambda m: m.update(repeat=True), "repeat is true (an integer"),
    "workers not a list": (lambda m: m.update(workers={}), "workers is {} (a list is expected)"),
    "warmup negative": (lambda m: m["run"].update(warmup_steps=-1),
                        "run.warmup_steps is -1 (a number >= 0"),
    "warmup a string": (lambda m: m["run"].update(warmup_steps="2"),
                        "run.warmup_steps is \"2\" (an integer"),
    "run workers not objects": (lambda m: m["run"].update(workers=["cpu"]),
                                "run.workers holds \"cpu\" (a list of objects"),
    "launcher pid a string": (lambda m: m.update(launcher={"host": "h", "pid": "1",
                                                           "started": 5}),
                              "launcher.pid is \"1\""),
    "run_id missing": (_delete("run_id"), "run_id is missing"),
    "suite name missing": (_delete("suite", "name"), "suite.name is missing"),
    "run missing": (_delete("run"), "run is missing"),
    "suite name a path": (lambda m: m["suite"].update(name="../x"),
                          'suite.name is "../x" (letters, digits and ._- are expected)'),
    "run name a path": (lambda m: m["run"].update(name="a/b"), 'run.name is "a/b"'),
    # objects the report reads into (a campaign found each an internal error)
    "load a string": (lambda m: m.update(load="busy"), 'load is "busy" (an object or null'),
    "clock a number": (lambda m: m.update(clock=3), "clock is 3 (an object or null"),
    "aggregator a string": (lambda m: m["run"].update(aggregator="torch"),
                            'run.aggregator is "torch" (an object or null'),
    "partition a list": (lambda m: m["run"].update(partition=["equal"]),
                         'run.partition is ["equal"] (an object is expected)'),
    "partition history not objects": (lambda m: m.update(partition_history=[1]),
                                      "partition_history holds 1 (a list of objects"),
    "standalone not objects": (lambda m: m.update(standalone=[[1]]),
                               "standalone holds [1] (a list of objects"),
    "pipeline a string": (lambda m: m.update(pipeline="1f1b"),
                          'pipeline is "1f1b" (an object is expected)'),
    "schema 99": (lambda m: m.update(schema_version=99), "schema_version 99 is not supported"),
    "schema a string": (lambda m: m.update(schema_version="1"),
                        "schema_version '1' is not supported"),
}


@pytest.mark.parametrize("case", MANIFEST_CASES)
def test_a_manifest_with_a_bad_field_is_one_line(run_dir: Path, case: str, hetbench) -> None:
    change, expected = MANIFEST_CASES[case]
    edit_manifest(run_dir, change)
    line = error_line(hetbench(run_dir.parent, "report", "--no-figures", str(run_dir.parent)),
                      run_dir / "manifest.json")
    assert expected in line


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"[1, 2, 3]", b"{\"schema"],
                         ids=["random bytes", "a list", "torn"])
def test_a_manifest_that_is_not_an_object_is_one_line(run_dir: Path, content: bytes,
                                                      hetbench) -> None:
    (run_dir / "manifest.json").write_bytes(content)
    error_line(hetbench(run_dir, "report", "--no-figures", str(run_dir)),
               run_dir / "manifest.json")


# -- steps.parquet and eval.parquet ----------------------------------------------------------


def test_steps_without_a_column_are_one_line(run_dir: Path, hetbench) -> None:
    steps = pd.read_parquet(run_dir / "steps.parquet")
    collector.write_steps(run_dir, steps.drop(columns=["ready_ns"]))
    line = error_line(hetbench(run_dir, "report", "--no-figures", str(run_dir)),
                      run_dir / "steps.parquet")
    assert "lacks column(s) ready_ns" in line


@pytest.mark.parametrize(("column", "values", "expected"), [
    ("begin_ns", lambda n: [str(i) for i in range(n)], "integers are expected"),
    ("ready_ns", lambda n: [float("nan")] * n, "float64 values (integers are expected)"),
    ("loss", lambda n: ["low"] * n, "numbers are expected"),
], ids=["timestamps as text", "timestamps as NaN", "loss as text"])
def test_steps_of_the_wrong_kind_are_one_line(run_dir: Path, column: str,
                                              values: Callable[[int], list[Any]],
                                              expected: str, hetbench) -> None:
    steps = pd.read_parquet(run_dir / "steps.parquet")
    steps[column] = values(len(steps))
    collector.write_steps(run_dir, steps)
    line = error_line(hetbench(run_dir, "report", "--no-figures", str(run_dir)),
                      run_dir / "steps.parquet")
    assert f"column {column} holds " in line and expected in line


@pytest.mark.parametrize("name", ["steps.parquet", "eval.parquet", "system.parquet"])
def test_a_table_that_is_not_parquet_is_one_line(run_dir: Path, name: str, hetbench) -> None:
    (run_dir / name).write_bytes(b"PAR1 this is not parquet\n" * 20)
    line = error_line(hetbench(run_dir, "report", "--no-figures", str(run_dir)), run_dir / name)
    assert "unreadable" in line


def test_evaluations_without_their_columns_are_one_line(run_dir: Path, hetbench) -> None:
    pd.DataFrame({"when": [1, 2]}).to_parquet(run_dir / "eval.parquet")
    line = error_line(hetbench(run_dir, "report", "--no-figures", str(run_dir)),
                      run_dir / "eval.parquet")
    assert "lacks column(s) step, samples, wall_s, train_s and 1 more" in line


def test_host_samples_without_their_columns_are_one_line(run_dir: Path, hetbench) -> None:
    pd.DataFrame({"t_ns": [1, 2]}).to_parquet(run_dir / "system.parquet")
    line = error_line(hetbench(run_dir, "report", "--no-figures", str(run_dir)),
                      run_dir / "system.parquet")
    assert "missing columns busy_cores, run_cores, others_cores" in line


# -- parts of a run that never finalised ------------------------------------------------------


def test_a_run_read_from_its_parts_is_reported(run_dir: Path, hetbench) -> None:
    to_parts(run_dir)
    with open(collector.part_path(run_dir, 1), "ab") as f:  # a crash mid-row: dropped
        f.write(b"\x07" * (RECORD_DTYPE.itemsize // 3))
    result = hetbench(run_dir, "report", "--no-figures", str(run_dir))
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert "| pair-r0 | failed |" in (run_dir.parent / "report" / "report.md").read_text()


@pytest.mark.parametrize("damage", ["random bytes", "bytes lost at the start"])
def test_a_damaged_part_is_one_line(run_dir: Path, damage: str, hetbench) -> None:
    to_parts(run_dir)
    part = collector.part_path(run_dir, 1)
    data = part.read_bytes()
    rng = np.random.default_rng(3)
    part.write_bytes(rng.bytes(len(data)) if damage == "random bytes" else data[8:])
    line = error_line(hetbench(run_dir, "report", "--no-figures", str(run_dir)), part)
    assert "not 1: damaged" in line


def test_a_part_with_time_going_backwards_names_the_part(run_dir: Path, hetbench) -> None:
    def backwards(records: np.ndarray) -> None:
        row_of(records, 1, 4)["end_ns"] = row_of(records, 1, 4)["reduced_ns"] - 5

    run_dir = a_run(run_dir.parent, name="torn", edit=backwards)
    to_parts(run_dir)
    line = error_line(hetbench(run_dir, "report", "--no-figures", str(run_dir)),
                      collector.part_path(run_dir, 1))
    assert "rank 1, step 4: end_ns" in line


# -- time going backwards ----------------------------------------------------------------------


def _set(column: str, value: Callable[[np.ndarray], int]) -> Callable[[np.ndarray], None]:
    def edit(records: np.ndarray) -> None:
        row = row_of(records, 1, 5)
        row[column] = value(row)
    return edit


BACKWARDS: dict[str, tuple[Callable[[np.ndarray], None], str]] = {
    "ready before begin": (_set("ready_ns", lambda r: r["begin_ns"] - 1000),
                           "ready_ns"),
    "reduced before ready": (_set("reduced_ns", lambda r: r["ready_ns"] - 1), "reduced_ns"),
    "end before reduced": (_set("end_ns", lambda r: r["reduced_ns"] - 1), "end_ns"),
    "negative phase": (_set("forward_ns", lambda r: -7), "forward_ns is negative (-7)"),
    "negative wait": (_set("wait_ns", lambda r: -1), "wait_ns is negative (-1)"),
}


@pytest.mark.parametrize("case", BACKWARDS)
def test_time_going_backwards_is_refused_naming_rank_step_and_column(tmp_path: Path,
                                                                     case: str, hetbench) -> None:
    edit, expected = BACKWARDS[case]
    run_dir = a_run(tmp_path / "synthetic", edit=edit)
    line = error_line(hetbench(tmp_path, "report", "--no-figures", str(run_dir)),
                      run_dir / "steps.parquet")
    assert f"rank 1, step 5: {expected}" in line


@pytest.mark.parametrize("command", ["compare", "figures"])
def test_compare_and_figures_refuse_time_going_backwards_too(tmp_path: Path,
                                                             command: str, hetbench) -> None:
    run_dir = a_run(tmp_path / "synthetic", edit=BACKWARDS["ready before begin"][0])
    args = {"compare": ["compare", str(run_dir.parent), str(run_dir)],
            "figures": ["figures", str(run_dir), "--out", str(tmp_path / "figs")]}[command]
    line = error_line(hetbench(tmp_path, *args), run_dir / "steps.parquet")
    assert "rank 1, step 5: ready_ns" in line and "is before begin_ns" in line


def test_a_later_bad_row_is_not_named_first(tmp_path: Path, hetbench) -> None:
    def two(records: np.ndarray) -> None:
        _set("apply_ns", lambda r: -1)(records)  # rank 1, step 5
        row_of(records, 0, 2)["ready_ns"] = row_of(records, 0, 2)["begin_ns"] - 1

    run_dir = a_run(tmp_path / "synthetic", edit=two)
    line = error_line(hetbench(tmp_path, "report", "--no-figures", str(run_dir)),
                      run_dir / "steps.parquet")
    assert "rank 0, step 2: ready_ns" in line


def test_legitimate_zeros_are_accepted(tmp_path: Path, hetbench) -> None:
    """Zero-length phases, and a run recorded with instrument = false (only begin and end:
    ready and reduced are 0)."""
    def uninstrumented(records: np.ndarray) -> None:
        for field in RECORD_FIELDS:
            if field.endswith("_ns") and field not in ("begin_ns", "end_ns"):
                records[field] = 0

    folder = tmp_path / "synthetic"
    bare = a_run(folder, name="bare", edit=uninstrumented)
    edit_manifest(bare, lambda m: m["run"].update(instrument=False))
    a_run(folder, name="pair", edit=_set("pack_ns", lambda r: 0))
    result = hetbench(tmp_path, "report", "--no-figures", str(folder))
    assert result.returncode == 0 and not result.stderr, result.stderr


# -- runs still running, runs of several suites ------------------------------------------------


def running(run_dir: Path, launcher: dict[str, Any] | None) -> None:
    def change(meta: dict[str, Any]) -> None:
        meta["status"] = "running"
        if launcher is not None:
            meta["launcher"] = launcher
    edit_manifest(run_dir, change)


def this_process(started_offset: int = 0) -> dict[str, Any]:
    """A launcher record naming this test process (alive), or with another start time
    (the pid reused: the launcher is gone)."""
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": ticks + started_offset}


def test_launcher_alive_tells_live_gone_and_unknown() -> None:
    assert launcher_alive({"launcher": this_process()}) is True
    assert launcher_alive({"launcher": this_process(started_offset=1)}) is False
    assert launcher_alive({"launcher": {**this_process(), "host": "elsewhere"}}) is None
    assert launcher_alive({}) is None


def test_process_start_ticks_reads_past_a_command_name_with_parentheses(tmp_path: Path,
                                                                         spawn: Spawn) -> None:
    script = tmp_path / "a) b (c"
    script.symlink_to("/bin/sleep")
    child = spawn([str(script), "30"])
    try:
        stat = Path(f"/proc/{child.pid}/stat").read_text()
        assert ") b (c)" in stat  # the command name holds both parentheses and spaces
        assert process_start_ticks(child.pid) == int(stat.rsplit(")", 1)[1].split()[19])
    finally:
        child.kill()
        child.wait()
    assert process_start_ticks(child.pid) is None


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A results folder: suite a with a finished run and three runs said to be running
    (launcher alive, gone, on another host), suite b with one finished run."""
    results = tmp_path / "results"
    for suite in ("a", "b"):
        run_dir = a_run(results / suite)
        edit_manifest(run_dir, lambda m, s=suite: m["suite"].update(name=s))
    for repeat, launcher in enumerate([this_process(), this_process(started_offset=1),
                                       {**this_process(), "host": "elsewhere"}, None],
                                      start=1):
        run_dir = a_run(results / "a", repeat=repeat)
        edit_manifest(run_dir, lambda m: m["suite"].update(name="a"))
        running(run_dir, launcher)
    return results


def check_running_notes(lines: list[str], results: Path) -> None:
    a = results / "a"
    assert f"hetbench: note: {a / 'pair-r1'} is still running (launcher pid {os.getpid()} " \
           "alive): left out" in lines
    assert f"hetbench: note: {a / 'pair-r2'} says running but its launcher is gone: left out " \
           f"(hetbench recover {a / 'pair-r2'} closes it as failed from its parts)" in lines
    assert f"hetbench: note: {a / 'pair-r3'} says running; cannot tell whether its launcher " \
           "lives (recorded on host elsewhere): left out" in lines
    assert f"hetbench: note: {a / 'pair-r4'} says running; cannot tell whether its launcher " \
           "lives (no launcher recorded): left out" in lines


def test_report_keeps_suites_apart_and_leaves_running_runs_out(mixed: Path, hetbench) -> None:
    result = hetbench(mixed, "report", "--no-figures", str(mixed))
    lines = notes(result)
    assert len(lines) == 5
    assert f"hetbench: note: {mixed} holds runs of 2 suites (a, b): reported apart" in lines
    check_running_notes(lines, mixed)
    for suite in ("a", "b"):
        text = (mixed / "report" / suite / "report.md").read_text()
        assert "1 run(s)" in text and "pair-r0" in text and "pair-r1" not in text
    assert "== suite a ==" in result.stdout and "== suite b ==" in result.stdout


def test_figures_keep_suites_apart_and_leave_running_runs_out(mixed: Path, hetbench) -> None:
    out = mixed.parent / "figs"
    lines = notes(hetbench(mixed, "figures", str(mixed / "a"), str(mixed / "b"),
                           "--out", str(out)))
    assert f"hetbench: note: {mixed / 'a'} and {mixed / 'b'} hold runs of 2 suites (a, b): " \
           f"figures of each in {out}/SUITE" in lines
    check_running_notes(lines, mixed)
    assert (out / "a" / "compute_per_step.png").is_file()
    assert (out / "b" / "compute_per_step.png").is_file()


def test_compare_leaves_running_runs_out_and_says_suites_differ(mixed: Path, hetbench) -> None:
    result = hetbench(mixed, "compare", str(mixed), str(mixed / "b"))
    lines = notes(result)
    assert len(lines) == 5
    assert f"hetbench: note: BASE {mixed} and CURRENT {mixed / 'b'} hold runs of 2 suites " \
           "(a, b): compared suite by suite" in lines
    check_running_notes(lines, mixed)
    assert "left out (status running)" not in result.stdout
    assert "a/pair is only in BASE" in result.stdout


def test_nothing_but_running_runs_is_one_line(tmp_path: Path, hetbench) -> None:
    run_dir = a_run(tmp_path / "synthetic")
    running(run_dir, this_process())
    result = hetbench(tmp_path, "report", str(run_dir))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    note, error = result.stderr.splitlines()
    assert note.startswith("hetbench: note: ") and error.startswith("hetbench: error: ")
    assert "no finished run here" in error


# -- hostile JSON (issue 30) ----------------------------------------------------------------


def whole_run_spec(run_dir: Path) -> RunSpec:
    """The synthetic run's manifest given a whole run spec, as a launcher writes it (what
    recover and close_run rebuild the run from)."""
    import tomllib

    from hetbench.harness.spec.suite import parse_suite

    suite = parse_suite(tomllib.loads(f'[[runs]]\nname = "pair"\nsteps = {STEPS}\n'
                                      'workers = [ { device = "cpu" }, { device = "cpu" } ]\n'))
    edit_manifest(run_dir, lambda m: m.update(run=suite.runs[0].to_dict()))
    return suite.runs[0]


def test_a_manifest_nested_too_deep_is_one_line_in_every_reading_command(run_dir: Path,
                                                                         hetbench) -> None:
    """Python's JSON parser recurses: 100,000 levels raised RecursionError everywhere."""
    (run_dir / "manifest.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    folder = run_dir.parent
    for command in (["report", "--no-figures", str(folder)],
                    ["figures", str(folder), "--out", str(folder / "figures")],
                    ["compare", str(folder), str(folder)], ["simulate", str(run_dir)]):
        line = error_line(hetbench(folder, *command), run_dir / "manifest.json")
        assert line.endswith("unreadable manifest: JSON nested too deep"), (command, line)


def test_recover_closes_a_run_whose_worker_description_is_garbage_and_says_so(
        run_dir: Path, hetbench) -> None:
    """parts/rank0.json is what the worker said of itself at start: damaged, the run is
    still closed from its records, without that description, and a warning names it."""
    to_parts(run_dir)
    running(run_dir, this_process(started_offset=1))  # its launcher is gone
    whole_run_spec(run_dir)
    damaged = run_dir / collector.PARTS_DIR / "rank0.json"
    damaged.write_bytes(bytes(range(256)))
    result = hetbench(run_dir.parent, "recover", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert f"hetbench: warning: {damaged}: unreadable worker description: " in result.stderr
    assert "left out of the manifest" in result.stderr and "Traceback" not in result.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["workers"][0] == {"rank": 0}
    assert (run_dir / collector.STEPS_FILE).is_file()


# -- step rows no worker writes (issue 30) ----------------------------------------------------


def _damage_rows(kind: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def damage(steps: pd.DataFrame) -> pd.DataFrame:
        if kind == "empty":
            return steps.iloc[:0]
        if kind == "duplicated":
            return pd.concat([steps, steps.iloc[5:6]], ignore_index=True)
        if kind == "a rank without rows":  # report showed idle and efficiency NaN, exit 0
            return steps[steps["rank"] == 0]
        steps = steps.copy()
        column, value = {"negative batch": ("batch_size", -5), "rank 7": ("rank", 7),
                         "negative step": ("step", -3)}[kind]
        steps.loc[5, column] = value
        steps.loc[5, "loss"] = float("nan")
        return steps

    return damage


ROW_DAMAGE = {
    "empty": "steps.parquet: holds no step, yet the run says it completed: damaged",
    "duplicated": "row 24: rank 1, step 2 is recorded twice: damaged",
    "a rank without rows": "steps.parquet: holds no step of rank 1, one of the run's 2 "
                           "workers, yet the run says it completed: damaged",
    "negative batch": "row 5: batch_size -5 is negative: damaged",
    "rank 7": "row 5: rank 7 is not one of the run's 2 workers: damaged",
    "negative step": "row 5: step -3 is negative: damaged",
}


@pytest.mark.parametrize("kind", ROW_DAMAGE)
def test_step_rows_no_worker_writes_are_named_by_every_reader(run_dir: Path, kind: str,
                                                              hetbench) -> None:
    """report, figures, paper and compare exited 0 (a run `partial`, every metric NaN) or
    with "internal error: KeyError" on these."""
    good = a_run(run_dir.parent.parent / "good")
    collector.write_steps(run_dir, _damage_rows(kind)(pd.read_parquet(run_dir / "steps.parquet")))
    folder = run_dir.parent
    for command in (["report", "--no-figures", str(folder)],
                    ["paper", str(folder), "--out", str(folder / "paper")],
                    ["compare", str(good.parent), str(folder)]):
        line = error_line(hetbench(folder, *command), run_dir / "steps.parquet")
        assert line.endswith(ROW_DAMAGE[kind]), (command, line)


def test_compare_with_nothing_but_running_runs_is_one_line(tmp_path: Path, hetbench) -> None:
    good = a_run(tmp_path / "good")
    run_dir = a_run(tmp_path / "running")
    running(run_dir, None)
    result = hetbench(tmp_path, "compare", str(good.parent), str(run_dir.parent))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (f"hetbench: error: {run_dir.parent}: no finished "
                                              "run here (every run found says it is still "
                                              "running)")


def test_recover_writes_no_record_from_a_part_of_random_bytes(run_dir: Path, hetbench) -> None:
    """It exited 0 and wrote 41 rows of rank -1367059032 into steps.parquet."""
    to_parts(run_dir)
    running(run_dir, this_process(started_offset=1))  # its launcher is gone
    part = collector.part_path(run_dir, 1)
    part.write_bytes(np.random.default_rng(5).bytes(len(part.read_bytes())))
    result = hetbench(run_dir.parent, "recover", str(run_dir))
    assert result.returncode == 1 and "Traceback" not in result.stderr  # this run refused
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"hetbench: {part}: row 0 holds rank ")
    assert line.endswith("; recover writes no damaged record (move the file aside to close "
                         "the run from the others)")
    assert not (run_dir / collector.STEPS_FILE).exists()
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"


# -- closing first, the trace after (issue 30) ------------------------------------------------


def test_a_run_is_closed_before_its_trace_and_report_writes_a_missing_trace(
        run_dir: Path, hetbench, monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal's run is closed (steps.parquet, manifest) before the trace, which a long
    run took minutes to write; a trace cut short is written by the next report."""
    from hetbench.harness.records import rundir, trace

    to_parts(run_dir)
    running(run_dir, None)
    run = whole_run_spec(run_dir)
    status_when_traced: list[str] = []
    write_trace = trace.write_trace

    def watching(*args: Any, **kwargs: Any) -> None:
        status_when_traced.append(json.loads((run_dir / "manifest.json").read_text())["status"])
        write_trace(*args, **kwargs)

    monkeypatch.setattr(trace, "write_trace", watching)
    rundir.close_run(run_dir, run, "interrupted", "interrupted by SIGTERM")
    assert status_when_traced == ["interrupted"]
    steps = pd.read_parquet(run_dir / collector.STEPS_FILE)
    check_trace(run_dir / collector.TRACE_FILE, steps)
    (run_dir / collector.TRACE_FILE).unlink()  # as a SIGKILL during the trace leaves it
    result = hetbench(run_dir.parent, "report", "--no-figures", str(run_dir.parent))
    assert result.returncode == 0, result.stderr
    assert f"hetbench: note: {run_dir}: its trace was missing; written now" in result.stderr
    check_trace(run_dir / collector.TRACE_FILE, steps)
    again = hetbench(run_dir.parent, "report", "--no-figures", str(run_dir.parent))
    assert "trace was missing" not in again.stderr


def test_a_run_found_again_through_a_link_or_a_copy_is_read_once(
        run_dir: Path, hetbench, capsys: pytest.CaptureFixture[str]) -> None:
    """A link to a run's folder, or a copy of it, under the results read: the run counts
    once (pooled twice it made two repeats with an interval of zero width), with a note."""
    import shutil

    from hetbench.harness.records.results import find_runs, load_steps

    suite = run_dir.parent
    (suite / "linked").symlink_to(run_dir.name)
    shutil.copytree(run_dir, suite / "pair-r9-copy")
    assert find_runs([suite.parent]) == [run_dir]
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and all(f" is {run_dir} again (a link to it or a copy; run "
                                  "pair-r0 of suite synthetic, started " in line
                                  for line in said), said
    assert load_steps(suite)["repeat"].nunique() == 1
    capsys.readouterr()
    reported = hetbench(suite.parent, "report", "--no-figures", "--format", "json",
                        str(suite.parent))
    assert len(notes(reported)) == 2 and reported.returncode == 0
    throughput = json.loads(reported.stdout)["synthetic"]["tables"][0]["rows"]
    assert [(row["run"], row["repeats"]) for row in throughput] == [("pair", 1)]


def _steps_edit(change: Callable[[pd.DataFrame], Any]) -> Callable[[Path], None]:
    def edit(run_dir: Path) -> None:
        path = run_dir / collector.STEPS_FILE
        steps = pd.read_parquet(path)
        change(steps)
        steps.to_parquet(path)
    return edit


def _set_row(column: str, value: Any, row: int = 5) -> Callable[[pd.DataFrame], Any]:
    def change(steps: pd.DataFrame) -> None:
        steps[column] = steps[column].astype(type(value)) if isinstance(value, str) \
            else steps[column]
        steps.loc[row, column] = value
    return change


IMPLAUSIBLE: dict[str, tuple[Callable[[Path], None], str]] = {
    # a run of 12 steps of ~3.6 ms that lasted 10 s by its manifest
    "an instant of 2^62 ns": (_steps_edit(_set_row("end_ns", 2 ** 62, row=23)),
                              "its steps span 4.61e+09 s, and the run lasted 10 s (manifest "
                              "start to end): a damaged instant"),
    "a phase longer than its step": (_steps_edit(_set_row("forward_ns", 3_600_001, row=4)),
                                     "rank 0, step 2: forward_ns 3600001 is longer than its "
                                     "step (3600000 ns from begin to end): damaged"),
    "another run's id": (_steps_edit(_set_row("run_id", "other-r0")),
                         "row 5: run_id 'other-r0' is not the manifest's 'pair-r0': records "
                         "of another run"),
    "another repeat": (_steps_edit(_set_row("repeat", 3)),
                       "row 5: repeat 3 is not the manifest's 0: records of another run"),
    "rows not the manifest's": (lambda run_dir: edit_manifest(run_dir, lambda m: m.update(
        rows=25)), "holds 24 step records, the manifest says 25: damaged"),
}


@pytest.mark.parametrize("case", IMPLAUSIBLE)
def test_records_that_cannot_be_true_are_one_line(run_dir: Path, case: str, hetbench) -> None:
    """Step records a reader took with exit 0 (samples/s 8e-7 from one instant of 2^62 ns,
    a phase longer than its step, another run's rows, a count the manifest contradicts)."""
    edit_manifest(run_dir, lambda m: m.update(
        end=(datetime.fromisoformat(m["start"]) + timedelta(seconds=10)).isoformat(),
        rows=STEPS * WORLD))
    damage, expected = IMPLAUSIBLE[case]
    assert hetbench(run_dir.parent, "report", "--no-figures", str(run_dir)).returncode == 0
    damage(run_dir)
    line = error_line(hetbench(run_dir.parent, "report", "--no-figures", str(run_dir)),
                      run_dir / collector.STEPS_FILE)
    assert line.endswith(expected), line


def test_parts_holding_records_the_table_lacks_are_named(run_dir: Path, hetbench) -> None:
    steps = pd.read_parquet(run_dir / collector.STEPS_FILE)
    records = np.zeros(len(steps) + 3, dtype=RECORD_DTYPE)
    collector.part_path(run_dir, 0).parent.mkdir(exist_ok=True)
    collector.part_path(run_dir, 0).write_bytes(records.tobytes())
    said = notes(hetbench(run_dir.parent, "report", "--no-figures", str(run_dir)))
    assert f"hetbench: note: {run_dir / 'parts'} holds 27 step records and " \
           f"{run_dir / 'steps.parquet'} 24: the table is read, the parts' others are not" \
           in said, said


def test_a_part_of_a_rank_the_run_lacks_is_named_and_not_read(run_dir: Path,
                                                               hetbench) -> None:
    """Issue 58 (5): parts/rank7.bin beside the table of a run of 2 workers is no worker's:
    named on its own (it used to be counted in with the parts), the table read alone."""
    steps = pd.read_parquet(run_dir / collector.STEPS_FILE)
    records = np.zeros(5, dtype=RECORD_DTYPE)
    records["rank"] = 7
    collector.part_path(run_dir, 7).parent.mkdir(exist_ok=True)
    collector.part_path(run_dir, 7).write_bytes(records.tobytes())
    result = hetbench(run_dir.parent, "report", "--no-figures", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert notes(result) == [f"hetbench: note: {collector.part_path(run_dir, 7)}: rank 7 is "
                             "not one of the run's 2 workers: not read"]
    read = load_run(run_dir).steps
    assert len(read) == len(steps) and set(read["rank"]) == {0, 1}
