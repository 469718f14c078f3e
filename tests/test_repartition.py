"""Adaptive repartitioning: the policies on known cost models, damping, and the analysis
that evaluates them (recovery, time to loss, offline replay)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hetbench.analysis.measures import costmodel
from hetbench.analysis.tables.repartition import (
    recovery_steps,
    replay,
    replay_summary,
    time_to_loss,
)
from hetbench.harness.partition.policies import (
    Damping,
    Repartitioner,
    Window,
    WindowStats,
    equal_finish,
    limit_moves,
    update_ends,
)
from hetbench.harness.records.results import Run
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
    # the proportional policy (no line) always; the model policy while a worker's line was
    # fitted on one size (its first update), after which the line fitted on 128 and 64
    # samples takes the slice to its target at once (within max_move)
    slow = [(0.0, 1e6), (0.0, 1e3)]
    for policy in ("proportional", "model"):
        history = run_policy(policy, slow, damping=Damping(min_slice=4))
        halving = history if policy == "proportional" else history[:2]
        for before, after in zip(halving, halving[1:], strict=False):
            assert all(y / 2 - 1 <= x <= 2 * y + 1 for x, y in zip(after, before, strict=True))
        assert history[-1][0] == 4
    assert [h[0] for h in history[:3]] == [128, 64, 4]


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


def test_a_window_at_a_new_size_is_the_lines_second_point_not_a_new_speed() -> None:
    """A 3x slower worker with a large fixed cost (48 samples' worth): the first update
    can only move to the proportional split (one size fits no fixed cost); the window at
    that new size costs more than the line through the origin predicts, which is the
    intercept, not a change of speed. Taken for one (as before), every update threw the
    first size away and moved proportionally again: 64, 32, 20, 15, 9."""
    lines = [(3 * 48e4, 3e4), (48e4, 1e4)]  # t = 3(48 + n), 48 + n (10 us units)
    history = run_policy("model", lines, total=128, updates=4, damping=Damping(every=5))
    # then the line through 64 and 32 samples: its target, 8.0, at once
    assert [h[0] for h in history] == [64, 32, 8, 8, 8]
    r = Repartitioner("model", 128, 2, Damping(every=5))
    r.update((64, 64), windows_for((64, 64), lines))
    second = r.update((32, 96), windows_for((32, 96), lines))
    assert second is not None and "speed changed" not in second[1]
    # at the size the line was fitted on, a slower window is still a change of speed
    slowed = [(2 * a, 2 * b) for a, b in lines[:1]] + lines[1:]
    fitted = Repartitioner("model", 128, 2, Damping(every=5))
    fitted.update((64, 64), windows_for((64, 64), lines))
    change = fitted.update((64, 64), windows_for((64, 64), slowed))
    assert change is not None and "speed changed on worker(s) [0]" in change[1]


def test_the_first_update_comes_half_a_window_early() -> None:
    assert Repartitioner("model", 128, 2, Damping(every=5)).early_update_step() == 1
    assert Repartitioner("proportional", 128, 2, Damping(every=10)).early_update_step() == 4
    assert Repartitioner("model", 128, 2, Damping(every=3)).early_update_step() is None


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
    from hetbench.analysis.tables.repartition import evaluation_table

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
    (row,) = evaluation_table([Run.of(manifest, steps_frame(300, compute, comm_ms=0.0))],
                              0.5).to_dict(orient="records")
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
    from hetbench.harness.spec.partitions import PartitionSpec

    spec = PartitionSpec(policy="model", every=7, max_ratio=3.0, reset=0.2)
    assert Damping.of(spec) == Damping(every=7, max_ratio=3.0, reset=0.2)
    # a manifest written before max_ratio and reset existed keeps their defaults
    assert Damping.of({"every": 7, "dead_band": 0.1}) == Damping(every=7, dead_band=0.1)


def test_report_says_how_many_repeats_settled_after_the_jump() -> None:
    from hetbench.analysis.render.report import repartition_section

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
    text = "\n".join(repartition_section([Run.of(manifest(0), settles),
                                           Run.of(manifest(1), too_short)], 0.5))
    row = next(line for line in text.splitlines() if line.startswith("| abrupt | model"))
    assert "| 1/2 |" in row


# -- membership: a worker that does not pay for itself is left out ---------------------------


def membership_update(r: Repartitioner, sizes: tuple[int, ...],
                      lines: list[tuple[float, float]], comm_ns: float
                      ) -> tuple[tuple[int, ...], str] | None:
    """One update where every member computed at its line and the sums were back comm_ns
    after the slowest arrived (every member's begin-to-reduced time: lockstep); left-out
    workers (size 0) measured nothing."""
    windows = [w if n > 0 else WindowStats()
               for w, n in zip(windows_for(sizes, lines), sizes, strict=True)]
    slowest = max(a + b * n for (a, b), n in zip(lines, sizes, strict=True) if n > 0)
    synchronized = [slowest + comm_ns if n > 0 else float("nan") for n in sizes]
    return r.update(sizes, windows, synchronized)


def test_a_worker_that_costs_more_than_it_brings_is_left_out() -> None:
    # worker 1 is 10x slower per sample; the exchange costs 0.5 ms. With it the step is
    # 64/(1/b0 + 1/b1) ~ 58 samples' worth of worker 0 (1.16 ms) + 0.5 ms; without it 1.28 ms
    lines = [(0.0, 20_000.0), (0.0, 200_000.0)]
    r = Repartitioner("model", 64, 2, Damping(), leave_out=True)
    change = membership_update(r, (32, 32), lines, 500_000.0)
    assert change is not None
    sizes, reason = change
    assert sizes == (64, 0)
    assert "left out worker(s) [1]" in reason and "predicted step 1.280 ms" in reason
    # nothing changes while it stays the better choice
    assert membership_update(r, sizes, lines, float("nan")) is None


def test_workers_that_pay_only_together_with_the_exchange_are_left_out_together() -> None:
    # A GPU-like worker (3 ms fixed, 20 us per sample) and two CPU-like ones (5 ms + 400 us):
    # leaving out one CPU keeps the 3 ms exchange (5.54 + 3 ms against 5.51 + 3 ms with
    # both), leaving out both saves it (6.56 ms: the GPU's 128 samples on its line through
    # the origin, beyond the slices it was measured on)
    lines = [(3e6, 20_000.0), (5e6, 400_000.0), (5e6, 400_000.0)]
    r = Repartitioner("model", 128, 3, Damping(), leave_out=True)
    change = membership_update(r, (96, 16, 16), lines, 3e6)
    assert change is not None
    sizes, reason = change
    assert sizes == (128, 0, 0)
    assert "left out worker(s) [1, 2]" in reason and "predicted step 6.560 ms" in reason


def test_a_worker_that_pays_for_itself_is_kept() -> None:
    # a 2x (not 10x) slower worker and a 0.1 ms exchange: 0.85 ms + 0.1 ms against 1.28 ms
    lines = [(0.0, 20_000.0), (0.0, 40_000.0)]
    r = Repartitioner("model", 64, 2, Damping(), leave_out=True)
    change = membership_update(r, (32, 32), lines, 100_000.0)
    assert change is not None and 0 not in change[0]
    assert change[0][0] > change[0][1]  # rebalanced, both kept


def test_a_left_out_worker_is_taken_back_when_the_others_slow_down() -> None:
    lines = [(0.0, 20_000.0), (0.0, 200_000.0)]
    r = Repartitioner("model", 64, 2, Damping(), leave_out=True)
    sizes = membership_update(r, (32, 32), lines, 500_000.0)[0]  # type: ignore[index]
    assert sizes == (64, 0)
    # worker 0 becomes 30x slower: worker 1's last line (10x) now pays for itself
    slowed = [(0.0, 600_000.0), lines[1]]
    change = membership_update(r, sizes, slowed, float("nan"))
    assert change is not None
    assert "took back worker(s) [1]" in change[1] and min(change[0]) > 0


def test_no_worker_is_left_out_before_an_exchange_was_measured() -> None:
    lines = [(0.0, 20_000.0), (0.0, 200_000.0)]
    r = Repartitioner("model", 64, 2, Damping(), leave_out=True)
    change = membership_update(r, (32, 32), lines, float("nan"))
    assert change is not None and 0 not in change[0]  # only rebalanced
    without = Repartitioner("model", 64, 2, Damping())  # leave_out off: never an empty slice
    change = membership_update(without, (32, 32), lines, 500_000.0)
    assert change is not None and min(change[0]) >= 1


def test_leave_out_needs_the_model_policy() -> None:
    with pytest.raises(ValueError, match="leave_out needs the 'model' policy"):
        Repartitioner("proportional", 64, 2, Damping(), leave_out=True)


def test_taking_a_worker_back_needs_twice_the_gain_and_twice_more_each_time() -> None:
    r = Repartitioner("model", 64, 2, Damping(), leave_out=True)
    slow = (0.0, 200_000.0)
    # Beside worker 1, worker 0 computes at 20 us per sample (1.66 ms for the pair with the
    # 0.5 ms excess; alone 1.28 ms): worker 1 is left out.
    sizes = membership_update(r, (32, 32), [(0.0, 20_000.0), slow], 500_000.0)[0]  # type: ignore[index]
    assert sizes == (64, 0)
    # Alone it computes faster (17 us: no contention). The pair is still predicted from the
    # lines measured beside each other: 1.66 ms against 1.09 ms, no reason to take it back.
    assert membership_update(r, sizes, [(0.0, 17_000.0), slow], float("nan")) is None
    # Worker 0 slows to 55 us (a new speed: its lines in every context restart from it):
    # 3.52 ms alone, 3.26 ms with worker 1: 7.4% less is not enough (2 dead bands: 10%);
    # then 70 us (65 us smoothed: 4.16 ms alone against 3.26 ms) is.
    assert membership_update(r, sizes, [(0.0, 55_000.0), slow], float("nan")) is None
    change = membership_update(r, sizes, [(0.0, 70_000.0), slow], float("nan"))
    assert change is not None and "took back worker(s) [1]" in change[1]
    # worker 1 slows to 2 ms per sample: left out a second time
    change = membership_update(r, change[0], [(0.0, 70_000.0), (0.0, 2_000_000.0)], 500_000.0)
    assert change is not None and change[0] == (64, 0) and "left out" in change[1]
    # now 4 dead bands (20%): worker 0 at 300 and 500 us (10.4%, 18.4% less with worker 1)
    # is not enough, at 700 us (24.8%) it is
    for b in (300_000.0, 500_000.0):
        assert membership_update(r, (64, 0), [(0.0, b), (0.0, 2e6)], float("nan")) is None
    change = membership_update(r, (64, 0), [(0.0, 700_000.0), (0.0, 2e6)], float("nan"))
    assert change is not None and "took back worker(s) [1]" in change[1]
    # a worker taken back gets this state, and with it the same decisions
    other = Repartitioner("model", 64, 2, Damping(), leave_out=True)
    other.load_state(r.state())
    assert other.state() == r.state() and other.times_left_out == [0, 2]


def test_a_line_measured_beside_other_counts_is_taken_from_the_nearest_larger() -> None:
    """Worker 2 computed beside 2 and beside 4 workers, never 3: asked for a step of 3 the
    policy reads its line of 4 (ties: the larger count); the other counts' sets are made
    only when used."""
    r = Repartitioner("model", 64, 4, Damping(), leave_out=True)
    beside_two = WindowStats(10, 160, 1.6e7, 2560, 2.56e8)
    beside_four = WindowStats(10, 160, 3.2e7, 2560, 5.12e8)
    r.by_count.at(1)[2] = beside_two
    r.by_count.at(3)[2] = beside_four
    assert r._fits(3)[2] == beside_four and r._fits(2)[2] == beside_two
    assert r._fits(3)[0] == WindowStats()  # never measured: nothing
    assert sorted(r.by_count.sets) == [1, 3]
    other = Repartitioner("model", 64, 4, Damping(), leave_out=True)
    other.load_state(r.state())
    assert other.state() == r.state() and other._fits(3)[2] == beside_four


def test_a_workers_waits_inside_its_compute_stay_out_of_its_window() -> None:
    """A job's global BatchNorm makes a faster worker wait for the others inside its
    forward and backward: the adaptive policy fits a step's compute less those waits
    (Trainer.waits_in_compute), the first step at a size left out as ever, its waits read
    and dropped with it."""
    from types import SimpleNamespace

    from hetbench.harness.loop.repartitioning import Repartitioning
    from hetbench.harness.records import collector

    waits = iter([7 * MS, 3 * MS, 5 * MS])
    trainer = SimpleNamespace(partition_history=[{"sizes": [40, 24]}],
                              waits_in_compute=lambda: next(waits))
    repartitioning = Repartitioning(None, 0, None, trainer, None, None, None, [])  # type: ignore[arg-type]

    def record(compute_ns: int) -> tuple[object, ...]:
        marks = [0] * 9
        marks[collector.MARK_READY] = compute_ns
        marks[collector.MARK_REDUCED] = compute_ns + MS
        fields: list[object] = [None] * (collector.TIMED_MARKS + 1)
        fields[collector.TIMED_MARKS] = marks
        return tuple(fields)

    for compute in (20 * MS, 10 * MS, 12 * MS):
        repartitioning.measure(40, record(compute))
    stats = repartitioning.window.take()
    assert stats.count == 2 and stats.t == (10 - 3 + 12 - 5) * MS


def test_the_loop_updates_half_a_window_early_once_then_at_every_windows_end() -> None:
    from types import SimpleNamespace

    from hetbench.harness.loop.repartitioning import Repartitioning

    run = SimpleNamespace(partition=SimpleNamespace(every=10))
    repartitioning = Repartitioning(run, 0, None, SimpleNamespace(  # type: ignore[arg-type]
        partition_history=[{"sizes": [64, 64]}]), Repartitioner("model", 128, 2, Damping(
            every=10)), None, None, [])  # type: ignore[arg-type]
    due = []
    for step in range(30):
        if repartitioning.update_due(step):
            due.append(step)
            repartitioning.first_update_done = True  # what between_steps marks
    assert due == [4, 9, 19, 29]
    assert update_ends(10, 30) == [5, 10, 20] and update_ends(3, 9) == [3, 6]


def test_a_jobs_partition_waits_for_the_batches_its_loaders_made_ahead() -> None:
    """A job's new partition is in force after the most batches any worker's DataLoader
    makes ahead (processes x prefetch), the same on every rank; none without DataLoader
    processes, or for a built-in workload (its loader reads the slice asked for)."""
    from types import SimpleNamespace

    from hetbench.harness.loop.repartitioning import made_ahead
    from hetbench.harness.spec.loaders import LoaderSpec

    def run(is_job: bool, loader: LoaderSpec | None, *own: int | None) -> Any:
        return SimpleNamespace(is_job=is_job, loader=loader,
                               workers=[SimpleNamespace(loader_workers=n) for n in own])

    two = LoaderSpec(workers=2, prefetch=4)
    assert made_ahead(run(True, two, None, 1)) == 8
    assert made_ahead(run(True, LoaderSpec(workers=1, prefetch=2), None, 3)) == 6
    assert made_ahead(run(True, two, 0, 0)) == 0
    assert made_ahead(run(True, None, None, None)) == 0
    assert made_ahead(run(False, two, None, None)) == 0
