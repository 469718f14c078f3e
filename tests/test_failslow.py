"""Issue 31, part 6: fail-slow detection. Step records whose slowdowns are known by
construction (a jump, a drift, a recovery, bursts that are not fail-slow, slices an
adaptive policy changed), the check against a manifest's schedule, and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.trends.failslow import PERSIST, describe, detect
from hetbench.analysis.trends.failslow_check import check, suite_check
from hetbench.harness.cli.main import main
from hetbench.harness.records.results import Run
from tests.synthetic import steps_frame, write_run

STEPS = 300


def noisy(factor_of, seed: int = 0, slices=None, fixed_ms: float = 0.0):
    """Records of 2 workers: worker r's step s computes (fixed + 2 ms per 32 samples) x
    factor_of(r, s), times 5% log-normal noise drawn from `seed`."""
    noise = np.exp(np.random.default_rng(seed).normal(0.0, 0.05, size=(2, STEPS)))
    slice_of = slices or (lambda r, s: 32)

    def compute(r: int, s: int) -> float:
        return (fixed_ms + 2.0 * slice_of(r, s) / 32) * factor_of(r, s) * noise[r, s]

    frame = steps_frame(STEPS, compute)
    frame["batch_size"] = [slice_of(r, s) for r, s in zip(frame["rank"], frame["step"],
                                                          strict=True)]
    return frame


def only(found: pd.DataFrame) -> Any:
    """The one row (as detect's rows are read: attributes)."""
    assert len(found) == 1, found
    return next(found.itertuples())


def test_a_jump_is_found_at_its_step_with_its_factor() -> None:
    found = only(detect(noisy(lambda r, s: 3.0 if r == 0 and s >= 120 else 1.0)))
    assert (found.rank, found.kind, found.step) == (0, "jump", 120)
    assert found.factor == pytest.approx(3.0, rel=0.05)
    assert found.equal_slice and found.pm_steps <= 2
    assert describe(found) == "worker 0 became 3.0x slower at step 120 (±0)"


def test_a_drift_is_one_episode_over_its_span() -> None:
    def drift(r: int, s: int) -> float:  # 1x until 60, 2.5x from 180, linear between
        return 1.0 + 1.5 * min(max(s - 60, 0), 120) / 120 if r == 1 else 1.0

    found = only(detect(noisy(drift, seed=1)))
    assert (found.rank, found.kind) == (1, "drift")
    assert abs(found.step - 60) <= 20 and abs(found.end_step - 180) <= 20
    assert found.factor == pytest.approx(2.5, rel=0.1)
    assert describe(found).startswith("worker 1 slowed 2.")


def test_a_recovery_follows_the_slowdown_it_ends() -> None:
    found = detect(noisy(lambda r, s: 3.0 if r == 0 and 100 <= s < 200 else 1.0, seed=2))
    assert list(found["step"]) == [100, 200]
    assert found["factor"].to_numpy() == pytest.approx([3.0, 1 / 3.0], rel=0.05)
    recovery = list(found.itertuples())[1]
    assert describe(recovery).startswith("worker 0 became 3.0x faster at step 200")


@pytest.mark.parametrize("seed", range(5))
def test_bursts_and_noise_are_not_fail_slow(seed: int) -> None:
    """Another process takes the core for 2 to PERSIST - 1 steps (2.5x), on both workers,
    once in every 3 PERSIST steps (so that a burst stands apart: bursts closer than their
    length make one slow stretch); a small shift (1.2x) holds. Nothing is reported."""
    rng = np.random.default_rng(100 + seed)
    bursts = set()
    for rank in (0, 1):
        for start in range(0, STEPS - PERSIST, 3 * PERSIST):
            first = start + int(rng.integers(0, PERSIST // 2))
            bursts |= {(rank, s) for s in range(first, first + int(rng.integers(2, PERSIST)))}
    found = detect(noisy(lambda r, s: (2.5 if (r, s) in bursts else 1.0)
                         * (1.2 if r == 1 and s >= 150 else 1.0), seed=seed))
    assert found.empty, found


def test_a_slice_the_policy_shrank_is_not_a_slowdown_but_the_slowdown_before_it_is() -> None:
    """Per-sample time grows when a slice shrinks (the fixed cost per step is spread over
    fewer samples). Worker 0: 3x slower from step 100, its slice cut from 96 to 32 at 105
    (as an adaptive policy would); worker 1: its slice cut at 200 with no slowdown."""
    def slices(r: int, s: int) -> int:
        return 32 if (r == 0 and s >= 105) or (r == 1 and s >= 200) else 96

    found = only(detect(noisy(lambda r, s: 3.0 if r == 0 and s >= 100 else 1.0, seed=3,
                              slices=slices, fixed_ms=2.0)))
    assert (found.rank, found.step, found.equal_slice) == (0, 100, True)
    assert found.factor == pytest.approx(3.0, rel=0.1)  # read at the slice it had


def manifest(schedule: list[list[float]] | None, run_id: str = "r") -> dict:
    worker = {"slowdown_at": schedule} if schedule else {}
    return {"run_id": run_id, "run": {"warmup_steps": 0, "workers": [worker, {}]}}


def test_the_check_reads_the_schedule_and_measures_error_and_delay() -> None:
    jump = noisy(lambda r, s: 3.0 if r == 0 and s >= 120 else 1.0, seed=4)
    row = only(check(Run.of(manifest([[119, 1.0], [120, 3.0]]), jump)))
    assert row.truth == "worker 0 became 3.0x slower at step 120"
    assert row.step_error == 0 and abs(row.factor_error) < 0.05
    # Online, a jump is reported once it has held PERSIST steps, not before.
    assert PERSIST - 1 <= row.delay_steps <= PERSIST + 5
    assert row.false_alarms == 0
    # The same records against a schedule that jumped elsewhere: a miss and a false alarm.
    wrong = check(Run.of(manifest([[199, 1.0], [200, 3.0]]), jump))
    assert list(wrong["detected"]) == ["missed", describe(next(detect(jump).itertuples()))]
    assert list(wrong["false_alarms"]) == [0, 1]


def test_the_suite_check_counts_false_alarms_on_steady_runs() -> None:
    jump = noisy(lambda r, s: 3.0 if r == 0 and s >= 120 else 1.0, seed=5)
    steady = noisy(lambda r, s: 1.0, seed=6)
    _, summary = suite_check([Run.of(manifest([[119, 1.0], [120, 3.0]], "jump"), jump),
                              Run.of(manifest(None, "steady"), steady),
                              Run.of(manifest(None, "alarmed"), jump)])
    assert (summary["episodes"], summary["found"]) == (1, 1)
    assert (summary["steady_runs"], summary["steady_runs_alarmed"]) == (2, 1)
    assert summary["false_alarms_scheduled"] == 0


def test_the_report_says_when_a_worker_became_slower(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "results" / "s"
    run_dir = write_run(folder, noisy(lambda r, s: 3.0 if r == 0 and s >= 120 else 1.0, seed=7),
                        name="abrupt")
    meta_path = run_dir / "manifest.json"
    meta = json.loads(meta_path.read_text())
    meta["run"]["workers"][0]["slowdown_at"] = [[119, 1.0], [120, 3.0]]
    meta_path.write_text(json.dumps(meta))
    assert main(["report", str(folder), "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert "Fail-slow detection: 1/1 emulated slowdowns found, step error 0" in out
    text = (folder / "report" / "report.md").read_text()
    assert "Fail-slow: worker 0 became 3.0x slower at step 120" in text
    assert "## Fail-slow detection against the emulated schedules" in text
