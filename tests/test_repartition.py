"""Adaptive repartitioning: the policies on known cost models, damping, and the analysis
that evaluates them (recovery, time to loss, offline replay)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import costmodel
from analysis.repartition import (
    recovery_steps,
    replay,
    replay_summary,
    time_to_loss,
)
from harness.partition import (
    Damping,
    Repartitioner,
    Window,
    WindowStats,
    equal_finish,
    limit_moves,
)
from tests.synthetic import MS, steps_frame


def windows_for(sizes: tuple[int, ...], lines: list[tuple[float, float]], steps: int = 10
                ) -> list[WindowStats]:
    """What each worker measures over a window at these sizes, cost a + b*n (ns)."""
    out = []
    for n, (a, b) in zip(sizes, lines, strict=True):
        w = Window()
        for _ in range(steps):
            w.add(n, int(a + b * n))
        out.append(w.take())
    return out


def run_policy(policy: str, lines: list[tuple[float, float]], total: int = 256,
               updates: int = 12, damping: Damping | None = None) -> list[tuple[int, ...]]:
    r = Repartitioner(policy, total, len(lines), damping or Damping())
    sizes = tuple([total // len(lines)] * len(lines))
    history = [sizes]
    for _ in range(updates):
        change = r.update(sizes, windows_for(sizes, lines))
        if change is not None:
            sizes = change[0]
        history.append(sizes)
    return history


def finish_spread(sizes: tuple[int, ...], lines: list[tuple[float, float]]) -> float:
    times = [a + b * n for n, (a, b) in zip(sizes, lines, strict=True)]
    return max(times) / min(times) - 1


def test_equal_finish_closed_form() -> None:
    lines = [(1e6, 2e4), (3e5, 6e4)]
    sizes = equal_finish(128, lines, 1)
    assert sizes is not None and sum(sizes) == pytest.approx(128)
    times = [a + b * n for n, (a, b) in zip(sizes, lines, strict=True)]
    assert times[0] == pytest.approx(times[1])
    # A worker whose fixed cost alone exceeds the others' finish is pinned at the minimum.
    assert equal_finish(10, [(1e9, 1.0), (0.0, 1.0)], 2) == [2.0, 8.0]


def test_model_policy_balances_fixed_and_per_sample_costs() -> None:
    # Worker 0: 3 ms fixed + 60 us/sample; worker 1: 1 ms fixed + 20 us/sample.
    lines = [(3e6, 6e4), (1e6, 2e4)]
    history = run_policy("model", lines)
    assert finish_spread(history[-1], lines) < 0.05
    assert sum(history[-1]) == 256 and history[-1][0] < 128


def test_proportional_policy_matches_per_sample_rates() -> None:
    lines = [(0.0, 6e4), (0.0, 2e4)]  # pure per-sample costs: 1 : 3
    history = run_policy("proportional", lines, damping=Damping(smoothing=1.0))
    assert history[-1] == (64, 192)


def test_dead_band_keeps_a_balanced_partition() -> None:
    lines = [(0.0, 2.02e4), (0.0, 2e4)]  # 1% apart: inside the 5% dead band
    assert run_policy("model", lines)[-1] == (128, 128)
    assert run_policy("proportional", lines)[-1] == (128, 128)


def test_moves_are_limited_and_sizes_stay_valid() -> None:
    lines = [(0.0, 1e6), (0.0, 1e3)]  # worker 0 a thousand times slower
    history = run_policy("model", lines, damping=Damping(max_move=0.1, min_slice=4))
    for before, after in zip(history, history[1:], strict=False):
        assert sum(after) == 256 and min(after) >= 4
        assert max(abs(x - y) for x, y in zip(before, after, strict=True)) <= 26
    assert history[-1][0] == 4
    assert limit_moves((64, 64), (100.0, 28.0), 10, 1, 128) == (74, 54)


def test_every_rank_computes_the_same_partition() -> None:
    lines = [(2e6, 5e4), (1e6, 2e4), (5e5, 3e4)]
    assert run_policy("model", lines, total=255) == run_policy("model", lines, total=255)


def test_a_slice_at_most_doubles_or_halves_per_update() -> None:
    # the trust region: however far the target, one update halves worker 0's slice
    assert limit_moves((128, 128), (1.0, 255.0), 64, 1, 256, max_ratio=2.0) == (64, 192)
    assert limit_moves((40, 216), (1.0, 255.0), 64, 1, 256, max_ratio=2.0) == (20, 236)
    # a ratio below (o - 1) / o still lets a slice move by one sample, as it may upward
    assert limit_moves((5, 5), (1.0, 9.0), 10, 1, 10, max_ratio=1.1) == (4, 6)
    history = run_policy("model", [(0.0, 1e6), (0.0, 1e3)], damping=Damping(min_slice=4))
    for before, after in zip(history, history[1:], strict=False):
        assert all(x >= y / 2 - 1 and x <= 2 * y + 1 for x, y in zip(after, before, strict=True))
    assert history[-1][0] == 4


@pytest.mark.parametrize("policy", ["proportional", "model"])
def test_a_speed_change_resets_the_history(policy: str) -> None:
    """After worker 0 turns 3x slower, the first update acts on the new speed alone, not on
    an average with the old one (which would take several updates to forget)."""
    before, after = [(1e6, 2e4), (1e6, 2e4)], [(3e6, 6e4), (1e6, 2e4)]
    damping = Damping(smoothing=0.5, max_ratio=4.0, max_move=1.0)
    fresh = Repartitioner(policy, 256, 2, damping)
    warmed = Repartitioner(policy, 256, 2, damping)
    for _ in range(5):
        assert warmed.update((128, 128), windows_for((128, 128), before)) is None
    change = warmed.update((128, 128), windows_for((128, 128), after))
    assert change is not None and "speed changed on worker(s) [0]" in change[1]
    assert change[0] == fresh.update((128, 128), windows_for((128, 128), after))[0]
    no_reset = Repartitioner(policy, 256, 2, Damping(smoothing=0.5, max_ratio=4.0,
                                                     max_move=1.0, reset=10.0))
    for _ in range(5):
        no_reset.update((128, 128), windows_for((128, 128), before))
    lagging = no_reset.update((128, 128), windows_for((128, 128), after))
    assert lagging is not None and lagging[0][0] > change[0][0]  # moved less far


def test_recovery_after_an_abrupt_change() -> None:
    # Worker 0 jumps from 10 to 30 ms at step 100 (balance 0.67); a new partition brings it
    # to 10.5 ms from step 130 (balance 0.98) for the rest of the run.
    def compute(r: int, s: int) -> float:
        if r == 1 or s < 100:
            return 10.0
        return 30.0 if s < 130 else 10.5
    frame = steps_frame(300, compute, comm_ms=0.0)
    # the balance is back at step 130: the centred 10-step median sees it there (+-1)
    assert recovery_steps(frame, 100) == pytest.approx(30, abs=1)
    # a whole-machine slowdown moves the step time but not the balance: nothing to recover
    machine = steps_frame(300, lambda r, s: 10.0 if s < 100 else 25.0, comm_ms=0.0)
    assert recovery_steps(machine, 100) == 0.0
    # a static partition that never adapts is at its (bad) steady level at once
    static = steps_frame(300, lambda r, s: 30.0 if r == 0 and s >= 100 else 10.0, comm_ms=0.0)
    assert recovery_steps(static, 100) == 0.0


def test_evaluation_table_reads_scenario_policy_balance_and_recovery() -> None:
    from analysis.repartition import evaluation_table

    def compute(r: int, s: int) -> float:
        if r == 1 or s < 100:
            return 10.0
        return 30.0 if s < 130 else 10.5
    manifest = {"run_id": "x", "run": {
        "name": "abrupt.model", "steps": 300, "warmup_steps": 10,
        "partition": {"policy": "model"},
        "workers": [{"device": "cpu", "slowdown_at": [[99, 1.0], [100, 3.0]]},
                    {"device": "cpu"}]},
        "partition_history": [{"step": 0}, {"step": 130}]}
    (row,) = evaluation_table([(manifest, steps_frame(300, compute, comm_ms=0.0))], 0.5
                              ).to_dict(orient="records")
    assert (row["scenario"], row["policy"], row["changes"]) == ("abrupt", "model", 1)
    assert row["recovery_steps"] == pytest.approx(30, abs=1)
    assert row["balance"] == pytest.approx(10.0 / 10.5 * 0.5 + 0.5, abs=1e-3)


def test_time_to_a_target_loss() -> None:
    def losses(rows: np.ndarray) -> None:
        rows["loss"] = 2.0 / (1.0 + rows["step"])
    frame = steps_frame(20, lambda r, s: 10.0, comm_ms=0.0, edit=losses)
    seconds = time_to_loss(frame, 0.5)
    step_s = (10.0 + 0.1 + 0.01) / 1000
    assert seconds == pytest.approx(7 * step_s, rel=1e-3)  # the mean of steps 2-6 is 0.44
    assert np.isnan(time_to_loss(frame, 0.01))


def test_replay_of_a_static_run_predicts_what_a_policy_would_do() -> None:
    # An equal split where worker 0 is 3x slower per sample: 6 ms vs 2 ms per step.
    equal = steps_frame(100, lambda r, s: [6.0, 2.0][r], batch=lambda r: 64, comm_ms=0.5)
    lines = costmodel.fit(equal).lines
    assert lines[0].b_ns == pytest.approx(6 * MS / 64) and lines[0].a_ns == 0
    same = replay_summary(replay(equal, "equal"))
    assert same["mean_step_ms"] == pytest.approx(6.0 + 0.5 + 0.1, rel=1e-6)
    balanced = replay(equal, "proportional", Damping(smoothing=1.0))
    late = balanced[balanced["step"] >= 50]
    assert sorted(late.groupby("rank")["batch_size"].last().tolist()) == [32, 96]
    # Balanced: 32 x 3/32 ms = 3 ms on both workers.
    assert replay_summary(late)["mean_step_ms"] == pytest.approx(3.0 + 0.6, rel=1e-6)


def test_damping_is_read_from_a_suite_or_an_older_manifest() -> None:
    from harness.config import PartitionSpec

    spec = PartitionSpec(policy="model", every=7, max_ratio=3.0, reset=0.2)
    assert Damping.of(spec) == Damping(every=7, max_ratio=3.0, reset=0.2)
    # a manifest written before max_ratio and reset existed keeps their defaults
    assert Damping.of({"every": 7, "dead_band": 0.1}) == Damping(every=7, dead_band=0.1)


def test_report_says_how_many_repeats_settled_after_the_jump() -> None:
    from analysis.report import repartition_section

    def compute(r: int, s: int) -> float:
        if r == 1 or s < 100:
            return 10.0
        return 30.0 if s < 130 else 10.5

    def manifest(repeat: int) -> dict:
        return {"run_id": f"x{repeat}", "repeat": repeat, "run": {
            "name": "abrupt.model", "steps": 300, "warmup_steps": 10,
            "partition": {"policy": "model"},
            "workers": [{"device": "cpu", "slowdown_at": [[99, 1.0], [100, 3.0]]},
                        {"device": "cpu"}]},
            "partition_history": [{"step": 0}, {"step": 130}]}
    settles = steps_frame(300, compute, comm_ms=0.0)
    too_short = steps_frame(200, compute, comm_ms=0.0)  # too few steps after the jump to tell
    text = "\n".join(repartition_section([(manifest(0), settles), (manifest(1), too_short)],
                                          0.5))
    row = next(line for line in text.splitlines() if line.startswith("| abrupt | model"))
    assert "| 1/2 |" in row
