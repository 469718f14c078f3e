"""analysis/models/pipeline_model.py: pipelined virtual workers predicted from a data-parallel job's
devices (issue 29), on synthetic devices whose waves are worked out by hand here."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hetbench.analysis.models.deviceclass import CommModel, DeviceClass, Line, Source
from hetbench.analysis.models.pipeline_model import (
    MAX_WAVES,
    LayerShape,
    Pipeline,
    simulate_pipeline,
    stage_bounds,
)
from hetbench.harness.spec.workers import WorkerSpec

MS = 1e6
STEPS = 50


def device(name: str, ms_per_sample: float, slowdown: float = 1.0) -> DeviceClass:
    """Compute ms_per_sample x n ms for n samples (before its emulated slowdown), no noise,
    no gap after a step."""
    zeros = np.zeros(STEPS)
    source = Source(np.ones(STEPS), zeros, zeros, name, 0)
    return DeviceClass(name, name, Line(0.0, ms_per_sample * MS),
                       WorkerSpec(slowdown=slowdown), (source,), (0.0, 0.0, 0.5, 0.5, 0.0))


# two layers, 3/4 and 1/4 of the time; no activations or parameters to move
SHAPE = LayerShape((0.75, 0.25), (0.0, 0.0), (0.0, 0.0))
FREE = CommModel(0.0, 0.0, 0, "none")


def test_the_split_balances_the_stages_as_the_partitioner_does() -> None:
    # worker 0 3x faster than worker 1: the big layer on 0, the small one on 1
    assert stage_bounds(SHAPE, [[0.75, 0.25], [2.25, 0.75]]) == (0, 1, 2)
    three = LayerShape((0.25, 0.25, 0.5), (0.0,) * 3, (0.0,) * 3)
    assert stage_bounds(three, [[0.25, 0.25, 0.5]] * 2) == (0, 2, 3)


def test_one_virtual_worker_of_two_stages_steps_at_the_wave_worked_out_by_hand() -> None:
    fast, slow = device("fast", 0.1), device("slow", 0.1, slowdown=3.0)
    # global batch 32 in 4 micro-batches of 8: whole model 0.8 ms on fast, 2.4 on slow;
    # layer 0 (0.75) on fast: 0.6 ms, layer 1 (0.25) on slow: 0.6 ms, each a forward of a
    # third and a backward of two: 1F1B's wave (M + S - 1) x 0.6 = 3.0 ms
    got = simulate_pipeline([fast, slow], FREE, Pipeline(((0, 1),), 4, 0), SHAPE, STEPS, 32,
                            None, (1, 1), (1.0, 1.0))
    assert got["mean_step_ms"] == pytest.approx(3.0)
    assert got["samples_per_s"] == pytest.approx(32 / 3.0e-3)
    assert got["idle_fraction"] == 0.0 and got["mean_staleness"] == 0.0
    assert got["compute_share"] == pytest.approx(4 * 0.6 / 3.0)  # each stage's 4 micro


def test_lockstep_virtual_workers_wait_for_the_slowest_and_all_reduce_each_stage() -> None:
    fast, slow = device("fast", 0.1), device("slow", 0.1, slowdown=3.0)
    # virtual workers of one kind, (fast, fast) and (slow, slow), 16 samples each in 4
    # micro-batches of 4, the layers halves: fast stages 0.2 ms a micro-batch, a wave of
    # 5 x 0.2 = 1.0 ms; slow 3.0 ms. Then each stage's all-reduce between the 2: a ring
    # of its parameter bytes, 2 x (0 + bytes x 1 ns / 2): 1 us (stage 0), 3 us (stage 1)
    comm = CommModel(alpha_ns=0.0, beta_ns_per_byte=1.0, bytes=0, origin="test")
    shape = LayerShape((0.5, 0.5), (0.0, 0.0), (1000.0, 3000.0))
    got = simulate_pipeline([fast, fast, slow, slow], comm, Pipeline(((0, 1), (2, 3)), 4, 0),
                            shape, STEPS, 32, None, (1,) * 4, (1.0,) * 4)
    # the next wave's first op, stage 0's forward, waits for the stage-0 all-reduce
    assert got["mean_step_ms"] == pytest.approx(3.001)
    # the fast virtual worker's stages wait at the exchange: stage 0 for the slow stage 0
    # (3.0 - 1.0), stage 1 for the slow stage 1, which ends before its stage 0's last
    # backward: (3.0 - 0.4) - (1.0 - 0.1333); the slow ones wait for nobody
    waits = (3.0 - 1.0) + (2.6 - (1.0 - 0.4 / 3))
    assert got["idle_fraction"] == pytest.approx(waits / 3.001 / 4 * (STEPS - 1) / STEPS)
    assert got["comm_share"] == pytest.approx(0.003 / 3.001)


def test_a_wave_bound_lets_a_virtual_worker_run_at_most_d_waves_ahead() -> None:
    fast, slow = device("fast", 0.1), device("slow", 0.1, slowdown=3.0)
    halves = LayerShape((0.5, 0.5), (0.0, 0.0), (0.0, 0.0))
    plan = Pipeline(((0, 1), (2, 3)), 4, 2)
    got = simulate_pipeline([fast, fast, slow, slow], FREE, plan, halves, STEPS, 32, None,
                            (1,) * 4, (1.0,) * 4)
    # the slow virtual worker never waits: the run lasts its 50 waves of 3.0 ms
    assert got["mean_step_ms"] == pytest.approx(3.0)
    assert got["mean_staleness"] > 0  # the slow one's waves see the fast one's updates
    # the fast one waits for the bound: 2 of every 3 ms, once it is 2 waves ahead
    assert got["idle_fraction"] == pytest.approx(0.5 * 2.0 / 3.0, rel=0.1)
    alike = simulate_pipeline([fast, fast, fast, fast], FREE, plan, halves, STEPS, 32, None,
                              (1,) * 4, (1.0,) * 4)
    assert alike["mean_step_ms"] == pytest.approx(1.0) and alike["idle_fraction"] == 0.0
    # two alike virtual workers end their waves together: each wave sees the other's
    # update of the same wave (1 version behind), as wsp's runs record
    assert alike["mean_staleness"] == pytest.approx(1.0)


def test_more_computing_threads_than_cores_slow_the_stages_computing_together() -> None:
    fast = device("fast", 0.1)
    halves = LayerShape((0.5, 0.5), (0.0, 0.0), (0.0, 0.0))
    plan = Pipeline(((0, 1), (2, 3)), 4, 0)
    runs = {cores: simulate_pipeline([fast] * 4, FREE, plan, halves, STEPS, 32, cores,
                                     (1,) * 4, (1.0,) * 4) for cores in (None, 1, 2, 8)}
    assert runs[None]["mean_step_ms"] == pytest.approx(1.0)
    assert runs[8]["mean_step_ms"] == pytest.approx(1.0)  # enough cores: as alone
    # one core: all the work, 4 stages x 4 micro-batches x 0.2 ms, one op at a time at best
    assert runs[1]["mean_step_ms"] >= 3.2 - 1e-9
    assert runs[None]["mean_step_ms"] < runs[2]["mean_step_ms"] < runs[1]["mean_step_ms"]


def test_a_long_run_is_simulated_on_waves_taken_over_all_its_steps() -> None:
    fast = device("fast", 0.1)
    # worker 1 slows down 3x at step 1,000 of 1,200 (more than MAX_WAVES): of the 300
    # waves taken evenly, the last 50 are slow. One virtual worker, the layers halves,
    # micro-batches of 8: 0.4 ms a stage, a wave 5 x 0.4 = 2.0 ms; slow, stage 1 takes
    # 1.2 ms a micro-batch: stage 0's first forward, stage 1's 4, stage 0's last backward:
    # 0.4 / 3 + 4 x 1.2 + 0.8 / 3 = 5.2 ms
    assert MAX_WAVES == 300
    slowing = dataclasses.replace(fast, schedule=WorkerSpec(
        slowdown_at=((0, 1.0), (999, 1.0), (1000, 3.0))))
    halves = LayerShape((0.5, 0.5), (0.0, 0.0), (0.0, 0.0))
    got = simulate_pipeline([fast, slowing], FREE, Pipeline(((0, 1),), 4, 0), halves, 1200,
                            32, None, (1, 1), (1.0, 1.0))
    assert got["mean_step_ms"] == pytest.approx((250 * 2.0 + 50 * 5.2) / 300)
