"""analysis/pipeline_model.py: pipelined virtual workers predicted from a data-parallel job's
devices (issue 29), on synthetic devices whose waves are worked out by hand here."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.deviceclass import CommModel, DeviceClass, Line, Source
from analysis.pipeline_model import LayerShape, Pipeline, simulate_pipeline, stage_bounds, wave_ns
from harness.spec.workers import WorkerSpec

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


def test_a_wave_fills_drains_and_goes_at_its_slowest_stage() -> None:
    assert wave_ns(np.array([[1.0, 3.0], [2.0, 2.0]]), 4).tolist() == [13.0, 10.0]


def test_the_split_balances_the_stages_as_the_partitioner_does() -> None:
    # worker 0 3x faster than worker 1: the big layer on 0, the small one on 1
    assert stage_bounds(SHAPE, [1.0, 3.0]) == (0, 1, 2)
    three = LayerShape((0.25, 0.25, 0.5), (0.0,) * 3, (0.0,) * 3)
    assert stage_bounds(three, [1.0, 1.0]) == (0, 2, 3)


def test_one_virtual_worker_of_two_stages_steps_at_the_wave_worked_out_by_hand() -> None:
    fast, slow = device("fast", 0.1), device("slow", 0.1, slowdown=3.0)
    # global batch 32 in 4 micro-batches of 8: whole model 0.8 ms on fast, 2.4 on slow;
    # layer 0 (0.75) on fast: 0.6 ms, layer 1 (0.25) on slow: 0.6 ms; wave 2 x 0.6 + 3 x 0.6
    got = simulate_pipeline([fast, slow], FREE, Pipeline(((0, 1),), 4, 0), SHAPE, STEPS, 32,
                            None, (1, 1), (1.0, 1.0))
    assert got["mean_step_ms"] == pytest.approx(3.0)
    assert got["samples_per_s"] == pytest.approx(32 / 3.0e-3)
    assert got["idle_fraction"] == 0.0 and got["mean_staleness"] == 0.0
    assert got["compute_share"] == pytest.approx(4 * 0.6 / 3.0)  # each stage's 4 micro


def test_lockstep_virtual_workers_wait_for_the_slowest_and_all_reduce_each_stage() -> None:
    fast, slow = device("fast", 0.1), device("slow", 0.1, slowdown=3.0)
    # virtual workers of one kind: (fast, fast) and (slow, slow), 16 samples each, micro 4;
    # fast: 0.3 + 0.1 ms stages -> 0.4 + 3 x 0.3 = 1.3 ms; slow: 3x, 3.9 ms
    comm = CommModel(alpha_ns=10_000.0, beta_ns_per_byte=1.0, bytes=0, origin="test")
    shape = LayerShape((0.75, 0.25), (0.0, 0.0), (1000.0, 3000.0))
    got = simulate_pipeline([fast, fast, slow, slow], comm, Pipeline(((0, 1), (2, 3)), 4, 0),
                            shape, STEPS, 32, None, (1,) * 4, (1.0,) * 4)
    # stage 0 sends its activations on and takes their gradients back: 2 x 10 us a
    # micro-batch (no bytes); slow: 0.92 + 0.3 + 3 x 0.92 = 3.98 ms, fast 1.38 ms; then
    # the larger stage's all-reduce between 2: 2 x (10 us + 3000 B x 1 ns / 2) = 23 us
    assert got["mean_step_ms"] == pytest.approx(3.98 + 0.023)
    # the fast virtual worker's two workers wait 2.6 ms of each step
    assert got["idle_fraction"] == pytest.approx(2 * 2.6 / 4.003 / 4)
    assert got["comm_share"] == pytest.approx(0.023 / 4.003)


def test_a_wave_bound_lets_a_virtual_worker_run_at_most_d_waves_ahead() -> None:
    fast, slow = device("fast", 0.1), device("slow", 0.1, slowdown=3.0)
    plan = Pipeline(((0, 1), (2, 3)), 4, 2)
    got = simulate_pipeline([fast, fast, slow, slow], FREE, plan, SHAPE, STEPS, 32, None,
                            (1,) * 4, (1.0,) * 4)
    # in the long run the fast one waits for the slow one: the slow one's pace, 3.9 ms a
    # step, less what the fast one did ahead at the start (2 waves of the 50)
    assert got["mean_step_ms"] == pytest.approx(3.9, rel=0.01)
    assert got["mean_staleness"] > 0  # the slow one's waves see the fast one's updates
    alike = simulate_pipeline([fast, fast, fast, fast], FREE, plan, SHAPE, STEPS, 32, None,
                              (1,) * 4, (1.0,) * 4)
    assert alike["mean_step_ms"] == pytest.approx(1.3) and alike["idle_fraction"] == 0.0
    # two alike virtual workers end their waves together: each wave sees the other's
    # update of the same wave (1 version behind), as wsp's runs record
    assert alike["mean_staleness"] == pytest.approx(1.0)


def test_more_computing_threads_than_cores_stretch_the_compute() -> None:
    fast = device("fast", 0.1)
    plan = Pipeline(((0, 1), (2, 3)), 4, 0)
    alone = simulate_pipeline([fast] * 4, FREE, plan, SHAPE, STEPS, 32, None, (1,) * 4,
                              (1.0,) * 4)
    shared = simulate_pipeline([fast] * 4, FREE, plan, SHAPE, STEPS, 32, 2, (1,) * 4,
                               (1.0,) * 4)
    # four workers busy 0.3 / 1.3 and 0.1 / 1.3 of a wave ask for 2 x 1.6 / 1.3 = 2.46
    # cores of 2: the cores are busy all the time, the step = the work over the cores
    assert shared["contention_stretch"] > 1.0
    work_ms = 2 * 4 * (0.3 + 0.1)
    assert shared["mean_step_ms"] == pytest.approx(work_ms / 2, rel=0.01)
    assert alone["mean_step_ms"] == pytest.approx(1.3)
    on_many = simulate_pipeline([fast] * 4, FREE, plan, SHAPE, STEPS, 32, 8, (1,) * 4,
                                (1.0,) * 4)
    assert on_many["mean_step_ms"] == pytest.approx(1.3)  # enough cores: no stretch

