"""Issue 31, parts 2 and 3: `hetbench export` to TensorBoard (read back with TensorBoard's
own EventAccumulator and compared with steps.parquet) and to MLPerf-style logs (read back
with mlperf-logging's parser, checked with its compliance checker)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.view.metrics import with_derived
from hetbench.harness.cli.main import main
from tests.conftest import Spawn
from tests.synthetic import steps_frame, write_run
from tests.test_cli_errors import error_line

STEPS = 30


def evals_frame(accuracy: list[float]) -> pd.DataFrame:
    """An evaluation every 10 steps, 64 samples a step, 0.5 s of training between them."""
    steps = [10 * i for i in range(len(accuracy))]
    return pd.DataFrame({"step": steps, "samples": [64 * s for s in steps],
                         "wall_s": [0.55 * i for i in range(len(steps))],
                         "train_s": [0.5 * i for i in range(len(steps))], "eval_s": 0.05,
                         "loss": [2.0 - a for a in accuracy], "accuracy": accuracy,
                         "heldout_samples": 297})


def run_with_evals(folder: Path, name: str, accuracy: list[float],
                   target: float | None = 0.9) -> Path:
    run_dir = write_run(folder, steps_frame(STEPS, lambda r, s: [2.0, 3.0 + (s % 4)][r]),
                        name=name)
    evals_frame(accuracy).to_parquet(run_dir / "eval.parquet")
    meta = json.loads((run_dir / "manifest.json").read_text())
    meta["run"].update(eval_every=10, seed=3, lr=0.05,
                       target={"metric": "accuracy", "value": target} if target else None)
    (run_dir / "manifest.json").write_text(json.dumps(meta))
    return run_dir


def test_tensorboard_scalars_read_back_equal_the_records(tmp_path: Path, capsys) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = run_with_evals(tmp_path / "results" / "s", "pair", [0.2, 0.6, 0.95])
    out = tmp_path / "tb"
    for _ in range(2):  # a second export replaces the first
        assert main(["export", str(run_dir), "--to", "tensorboard", str(out)]) == 0
    assert f"tensorboard --logdir {out}" in capsys.readouterr().out
    steps = with_derived(pd.read_parquet(run_dir / "steps.parquet"))
    for rank in (0, 1):
        events = EventAccumulator(str(out / run_dir.name / f"rank{rank}"))
        events.Reload()
        mine = steps[steps["rank"] == rank].sort_values("step")
        for tag, column, scale in (("phase/compute_ms", "compute_ns", 1e6),
                                   ("phase/idle_ms", "idle_ns", 1e6),
                                   ("phase/comm_ms", "comm_ns", 1e6),
                                   ("slice/samples", "batch_size", 1)):
            scalars = events.Scalars(tag)
            assert [e.step for e in scalars] == list(range(STEPS))
            assert np.allclose([e.value for e in scalars], mine[column] / scale, rtol=1e-6)
    assert {e.value for e in EventAccumulator(str(out / run_dir.name / "rank1")).Reload()
            .Scalars("phase/idle_ms")} == {0.0}  # the slower worker never waits
    heldout = EventAccumulator(str(out / run_dir.name / "heldout")).Reload()
    accuracy = heldout.Scalars("heldout/accuracy")
    assert [(e.step, round(e.value, 6)) for e in accuracy] == [(0, 0.2), (10, 0.6), (20, 0.95)]
    assert set(heldout.Tags()["scalars"]) == {"heldout/loss", "heldout/accuracy"}


def mllog(path: Path) -> list:
    from mlperf_logging.compliance_checker import mlp_parser

    lines, errors = mlp_parser.parse_file(str(path), ruleset="6.0.0")
    assert errors == []
    return lines


def test_mlperf_logs_parse_and_pass_the_compliance_checker(tmp_path: Path, capsys) -> None:
    from hetbench.analysis.export.to_mlperf import RULES_FILE

    folder = tmp_path / "results" / "s"
    reached = run_with_evals(folder, "reached", [0.2, 0.92, 0.95])
    missed = run_with_evals(folder, "missed", [0.2, 0.5, 0.6])
    run_with_evals(folder, "none", [0.1], target=None).joinpath("eval.parquet").unlink()
    out = tmp_path / "mllog"
    assert main(["export", str(folder), "--to", "mlperf", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("training 6.0.0 common rules: passed") == 2
    assert "no held-out evaluations" in captured.err  # the run without: said, no log
    assert sorted(p.name for p in out.iterdir()) == [f"{missed.name}.log", RULES_FILE,
                                                     f"{reached.name}.log"]

    lines = mllog(out / f"{reached.name}.log")
    keys = [line.key for line in lines]
    assert keys[keys.index("init_start"):keys.index("init_start") + 3] == [
        "init_start", "init_stop", "run_start"]
    # MLPerf stops at the target: the evaluation that reached it is the last
    accuracies = [line.value["value"] for line in lines if line.key == "eval_accuracy"]
    assert accuracies == [0.2, 0.92]
    stop = lines[-1]
    assert stop.key == "run_stop" and stop.value["metadata"]["status"] == "success"
    assert stop.value["metadata"]["samples_count"] == 640
    assert next(line.value["value"] for line in lines
                if line.key == "submission_benchmark") == "mlp"

    lines = mllog(out / f"{missed.name}.log")
    assert [line.value["value"] for line in lines if line.key == "eval_accuracy"] == [0.2, 0.5,
                                                                                       0.6]
    assert lines[-1].value["metadata"]["status"] == "aborted"
    # every block trains (none before the evaluation at step 0), and takes time
    starts = [line for line in lines if line.key == "block_start"]
    stops = [line for line in lines if line.key == "block_stop"]
    assert len(starts) == len(stops) == 2
    assert all(stop.timestamp > start.timestamp and
               stop.value["metadata"]["samples_count"] > start.value["metadata"]["samples_count"]
               for start, stop in zip(starts, stops, strict=True))
    # each line says hetbench's module that logged it, not a path on this machine
    assert {line.value["metadata"]["file"] for line in lines} == {
        "hetbench/analysis/export/to_mlperf.py"}


def test_mlperfs_own_checker_passes_the_exported_logs(tmp_path: Path, capsys,
                                                       spawn: Spawn) -> None:
    """`python -m mlperf_logging.compliance_checker` as a user runs it, with the rules file
    the export writes and prints the command for."""
    from hetbench.analysis.export.to_mlperf import CHECKER_LOG, RULES_FILE

    folder = tmp_path / "results" / "s"
    reached = run_with_evals(folder, "reached", [0.2, 0.92, 0.95])
    out = tmp_path / "mllog"
    assert main(["export", str(folder), "--to", "mlperf", str(out)]) == 0
    printed = capsys.readouterr().out
    command = printed.strip().splitlines()[-1].split()
    assert command[:3] == ["python", "-m", "mlperf_logging.compliance_checker"]
    assert command[-5:] == ["--config", str(out / RULES_FILE), "--log_output",
                            str(out / CHECKER_LOG), str(out / "RUN_ID.log")]
    log = out / f"{reached.name}.log"
    done = spawn.run([sys.executable, *command[1:-1], str(log)], cwd=tmp_path,
                     capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "SUCCESS" in done.stdout + done.stderr, done.stderr[-2000:]
    assert (out / CHECKER_LOG).is_file() and not (tmp_path / CHECKER_LOG).exists()


def test_the_compliance_check_fails_a_log_that_breaks_the_rules(tmp_path: Path) -> None:
    from hetbench.analysis.export.to_mlperf import check, export, rules_file

    run_dir = run_with_evals(tmp_path / "results" / "s", "pair", [0.2, 0.95])
    log = tmp_path / "pair.log"
    assert export(json.loads((run_dir / "manifest.json").read_text()),
                  pd.read_parquet(run_dir / "eval.parquet"), log)
    rules = rules_file(tmp_path)
    assert check(log, rules) == []
    broken = tmp_path / "broken.log"
    broken.write_text("".join(line for line in log.read_text().splitlines(keepends=True)
                              if '"run_start"' not in line))
    problems = check(broken, rules)
    assert any("run_start" in p for p in problems)


@pytest.mark.parametrize("to, expected", [
    (["csv", "x"], "--to: 'csv': the format is one of tensorboard, mlperf, then a folder"),
    (["mlperf", " "], "--to: empty folder: name one ('.' for the current one)"),
])
def test_a_bad_format_or_folder_is_one_line(tmp_path: Path, hetbench, to: list[str],
                                            expected: str) -> None:
    run_dir = run_with_evals(tmp_path / "results" / "s", "pair", [0.5])
    assert error_line(hetbench(tmp_path, "export", str(run_dir), "--to", *to)) == \
        f"hetbench: error: {expected}"


def test_a_missing_package_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    from hetbench.harness.cli import export

    run_dir = run_with_evals(tmp_path / "results" / "s", "pair", [0.5])
    monkeypatch.setattr(export.importlib.util, "find_spec", lambda name: None)
    assert main(["export", str(run_dir), "--to", "tensorboard", str(tmp_path / "tb")]) == 2
    assert capsys.readouterr().err.strip() == (
        "hetbench: error: --to: tensorboard needs the tensorboard package: "
        "pip install 'hetbench[export]'")
    assert not (tmp_path / "tb").exists()
