"""analysis/models/stage_sharing.py: pipeline stages run op by op on shared cores, against
timelines worked out by hand here."""

from __future__ import annotations

import numpy as np
import pytest

from hetbench.analysis.models.stage_sharing import BACKWARD, FORWARD, Stage, run_waves, schedule


def test_the_schedules_order_ops_as_torch_pipelining_does() -> None:
    f, b = FORWARD, BACKWARD
    # as the `pipeline` suite's 1F1B run recorded them (2 stages, 4 micro-batches)
    assert schedule("1f1b", 0, 2, 4) == [(f, 0), (f, 1), (b, 0), (f, 2), (b, 1), (f, 3),
                                         (b, 2), (b, 3)]
    assert schedule("1f1b", 1, 2, 4) == [(f, 0), (b, 0), (f, 1), (b, 1), (f, 2), (b, 2),
                                         (f, 3), (b, 3)]
    assert schedule("gpipe", 1, 2, 2) == [(f, 0), (f, 1), (b, 0), (b, 1)]
    with pytest.raises(ValueError, match="gpipe or 1f1b"):
        schedule("interleaved", 0, 2, 4)


def _ops(waves: int, per_stage: list[tuple[float, float]]) -> np.ndarray:
    """work[k, p, op] from each stage's (forward, backward)."""
    return np.array([per_stage] * waves, dtype=float)


def _after_each_wave(stages: list[Stage], exchange: float):
    def gate(p: int, k: int, end: np.ndarray) -> float:
        return 0.0 if k == 0 else float(end[k - 1].max() + exchange)
    return gate


def test_a_lone_virtual_worker_fills_drains_and_goes_at_its_pace() -> None:
    stages = [Stage(0, 0, 2, 1), Stage(0, 1, 2, 1)]
    # forward 1, backward 2 on both stages, 4 micro-batches: 1F1B's makespan (M + S - 1)
    # x (F + B) = 5 x 3 = 15; then 0.5 of exchange before the next wave
    begin, end, busy = run_waves(stages, _ops(3, [(1.0, 2.0), (1.0, 2.0)]), np.ones((3, 2)),
                                 [0.0, 0.0], "1f1b", 4, None, _after_each_wave(stages, 0.5))
    assert end[:, 0].tolist() == [15.0, 30.5, 46.0]
    assert begin[:, 1].tolist() == [1.0, 16.5, 32.0]  # stage 1 waits for forward 0
    assert busy.tolist() == [[12.0, 12.0]] * 3


def test_a_link_delays_each_micro_batch_on_its_way_and_back() -> None:
    stages = [Stage(0, 0, 2, 1), Stage(0, 1, 2, 1)]
    # one micro-batch: F0 (1), over the link (0.25), F1 (1), B1 (2), back (0.25), B0 (2)
    begin, end, _ = run_waves(stages, _ops(1, [(1.0, 2.0), (1.0, 2.0)]), np.ones((1, 2)),
                              [0.25, 0.0], "gpipe", 1, None, _after_each_wave(stages, 0.0))
    assert end[0].tolist() == [6.5, 4.25]


def test_stages_computing_at_once_share_the_cores() -> None:
    # two virtual workers in lockstep, 2 stages each, one micro-batch, one core: the two
    # stage-0 forwards run together at half speed (2), then the stage-1 forwards (2) and
    # backwards (4), then the stage-0 backwards (4): 12, where alone it is 1 + 1 + 2 + 2
    stages = [Stage(0, 0, 2, 1), Stage(0, 1, 2, 1), Stage(1, 0, 2, 1), Stage(1, 1, 2, 1)]
    work = _ops(1, [(1.0, 2.0)] * 4)
    gate = _after_each_wave(stages, 0.0)
    alone = run_waves(stages, work, np.ones((1, 4)), [0.0] * 4, "gpipe", 1, None, gate)
    one_core = run_waves(stages, work, np.ones((1, 4)), [0.0] * 4, "gpipe", 1, 1, gate)
    two_cores = run_waves(stages, work, np.ones((1, 4)), [0.0] * 4, "gpipe", 1, 2, gate)
    assert alone[1].max() == 6.0 and two_cores[1].max() == 6.0
    assert one_core[1].max() == pytest.approx(12.0)


def test_an_emulated_slowdown_stretches_the_wait_for_a_core_too() -> None:
    # as above, stage 1 of each a device 3x slower (a third of the work, then sleeping 2x
    # the op's time): alone its forward takes 1/3 + 2/3; on one core beside the other
    # virtual worker's, its real part takes 2/3 and it sleeps 4/3 (2 in all, not 1/3 + 1)
    stages = [Stage(0, 0, 2, 1), Stage(0, 1, 2, 1), Stage(1, 0, 2, 1), Stage(1, 1, 2, 1)]
    work = _ops(1, [(1.0, 2.0), (1 / 3, 2 / 3)] * 2)
    factor = np.array([[1.0, 3.0, 1.0, 3.0]])
    gate = _after_each_wave(stages, 0.0)
    _, alone, _ = run_waves(stages, work, factor, [0.0] * 4, "gpipe", 1, None, gate)
    _, shared, busy = run_waves(stages, work, factor, [0.0] * 4, "gpipe", 1, 1, gate)
    assert alone.max() == pytest.approx(6.0)
    assert shared.max() == pytest.approx(12.0)
    assert busy[0].tolist() == pytest.approx([6.0, 6.0, 6.0, 6.0])


def test_a_stage_without_threads_on_the_cores_is_never_slowed() -> None:
    # stage 1 computes on a GPU (no threads on the host's core): the two stage-0 forwards
    # share the core, the stage-1 ops run at full speed
    stages = [Stage(0, 0, 2, 1), Stage(0, 1, 2, 0), Stage(1, 0, 2, 1), Stage(1, 1, 2, 0)]
    _, end, _ = run_waves(stages, _ops(1, [(1.0, 2.0)] * 4), np.ones((1, 4)), [0.0] * 4,
                          "gpipe", 1, 1, _after_each_wave(stages, 0.0))
    # forwards 0-2 (shared), stage 1's 2-5 (alone), the backwards 5-9 (shared)
    assert end[0].tolist() == pytest.approx([9.0, 5.0, 9.0, 5.0])
