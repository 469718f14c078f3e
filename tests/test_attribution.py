"""Straggler attribution from the kernel's counts (analysis/measures/stragglers.py): the
main thread's CPU time, its wait for a CPU and the rest of its compute (blocked), on
hand-built records whose answers are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.measures.stragglers import (
    CAUSES,
    attribute,
    breakdown_lines,
    cause_evidence,
    cause_shares,
    compute_breakdown,
)
from tests.synthetic import COUNTED_LATER, MS, steps_frame

# worker 1's compute per step (ms): 3 ms on the CPU, 1 ms waiting for one, typically
TYPICAL_CPU, TYPICAL_WAIT = 3.0, 1.0
# what worker 1 lost in some steps, and to what
LOST = {5: ("wait", 3.0), 9: ("blocked", 2.0), 13: ("gc", 2.5), 17: ("faults", 2.0),
        21: ("cpu", 2.0)}


def counted(rows: np.ndarray) -> None:
    """The kernel's counts of each row: worker 0 on the CPU all its compute; worker 1 as
    TYPICAL_* plus what LOST says of its step."""
    for name in COUNTED_LATER:
        rows[name] = 0
    for row in rows:
        compute = int(row["ready_ns"] - row["begin_ns"])
        if row["rank"] == 0:
            row["compute_cpu_ns"] = compute
            continue
        cpu, wait = TYPICAL_CPU * MS, TYPICAL_WAIT * MS
        kind, ms = LOST.get(int(row["step"]), ("", 0.0))
        if kind == "wait":
            wait += ms * MS
        elif kind in ("cpu", "gc", "faults"):
            cpu += ms * MS
        if kind == "gc":
            row["gc_ns"] = int(ms * MS)
        row["compute_faults"] = 5000 if kind == "faults" else 40
        row["compute_cpu_ns"], row["compute_wait_ns"] = int(cpu), int(wait)


def frame(others: dict[int, float] | None = None) -> pd.DataFrame:
    steps = steps_frame(30, lambda r, s: 2.0 if r == 0 else TYPICAL_CPU + TYPICAL_WAIT
                        + LOST.get(s, ("", 0.0))[1], edit=counted)
    if others is not None:
        steps = steps.assign(others_cores=steps["step"].map(others).fillna(0.0),
                             steal_cores=0.0)
    return steps


def test_each_measured_part_names_its_cause_and_the_causes_add_up_to_the_excess() -> None:
    a = attribute(frame(others={})).set_index("step")
    assert a.loc[5, "cause"] == "preempted" and a.loc[5, "preempted_ms"] == pytest.approx(3.0)
    assert a.loc[9, "cause"] == "blocked" and a.loc[9, "blocked_ms"] == pytest.approx(2.0)
    assert a.loc[13, "cause"] == "gc" and a.loc[13, "gc_ms"] == pytest.approx(2.5)
    assert a.loc[17, "cause"] == "page_faults" and a.loc[17, "page_faults_ms"] == \
        pytest.approx(2.0)
    assert a.loc[21, "cause"] == "on_cpu" and a.loc[21, "on_cpu_ms"] == pytest.approx(2.0)
    parts = a[[f"{c}_ms" for c in CAUSES]].sum(axis=1)
    np.testing.assert_allclose(parts, a["excess_ms"], atol=1e-9)
    assert a["unexplained_ms"].sum() == 0
    assert a.loc[5, "wait_ms"] == pytest.approx(TYPICAL_WAIT + 3.0)


def test_a_wait_for_a_cpu_beside_outside_load_is_interference_even_when_it_lasts() -> None:
    """Others keep a core busy during the whole run: the wait in step 5 is interference,
    though every step saw the same outside load (its median step's too)."""
    a = attribute(frame(others={s: 1.0 for s in range(30)})).set_index("step")
    assert a.loc[5, "cause"] == "interference"
    assert a.loc[5, "interference_ms"] == pytest.approx(3.0) and a.loc[5, "preempted_ms"] == 0
    lines = cause_evidence(a.reset_index())
    said = next(line for line in lines if line.startswith("interference"))
    # steps 5 (4 ms waited), 17 and 21 (more CPU time beside the load, 1 ms waited)
    assert "(3 steps named" in said
    assert "waited 2.00 ms for a CPU while 1.00 cores were busy outside the run" in said


def test_a_step_late_within_the_workers_own_noise_is_not_split() -> None:
    """Worker 1 computes 4 ms +- 0.4 (its noise) and is always last; step 7 is 0.1 ms
    late, step 11 3 ms late on the CPU."""
    wobble = np.random.default_rng(0).normal(0.0, 0.4, 40)
    late = {7: 0.1, 11: 3.0}

    def ms(r: int, s: int) -> float:
        return 2.0 if r == 0 else 4.0 + (late.get(s, 0.0) if s in late else wobble[s])

    steps = steps_frame(40, ms, edit=lambda rows: [rows[n].__setitem__(Ellipsis, 0)
                                                   for n in COUNTED_LATER])
    a = attribute(steps).set_index("step")
    assert a.loc[7, "cause"] == "noise" and a.loc[7, "noise_ms"] == a.loc[7, "excess_ms"]
    assert a.loc[11, "cause"] == "on_cpu" and a.loc[11, "noise_ms"] == 0


def test_the_run_summary_names_a_lasting_wait_for_a_cpu_and_who_held_the_cores() -> None:
    steps = frame(others={s: 1.0 for s in range(30)})
    breakdown = compute_breakdown(steps).set_index("rank")
    # worker 1 waits 1 ms of every 4 (and 3 more in step 5): about a quarter of its compute
    lost = sum(ms for _, ms in LOST.values())
    assert breakdown.loc[1, "wait_share"] == pytest.approx((30 + 3) / (30 * 4 + lost), rel=1e-6)
    assert breakdown.loc[0, "wait_share"] == 0 and breakdown.loc[1, "others_cores"] == 1.0
    lines = breakdown_lines(breakdown.reset_index())
    assert lines == ["Worker 1 waited for a CPU 25% of its compute time while 1.00 cores were "
                     "busy outside the run (interference for the whole run)."]
    quiet = breakdown_lines(compute_breakdown(frame(others={})))
    assert quiet == ["Worker 1 waited for a CPU 25% of its compute time with the cores taken "
                     "by the run's own processes and threads."]


def overshot(rows: np.ndarray) -> None:
    """Worker 1 slowed 2x, its stretch 1 ms long in steps 6 and 8, in step 6 waiting that
    1 ms for a CPU to wake on."""
    counted(rows)
    for row in rows:
        if row["rank"] != 1:
            continue
        natural = int((TYPICAL_CPU + TYPICAL_WAIT) * MS)
        row["compute_cpu_ns"] = TYPICAL_CPU * MS + MS // 10  # 0.1 ms in the stretch
        row["stretch_cpu_ns"] = MS // 10
        row["compute_wait_ns"], row["compute_faults"] = TYPICAL_WAIT * MS, 40
        row["stretch_ns"] = natural  # (2 - 1) x natural
        if row["step"] in (6, 8):
            row["stretch_ns"] += MS
        if row["step"] == 6:
            row["stretch_wait_ns"] = MS
            row["compute_wait_ns"] += MS


def test_a_stretch_that_waited_to_wake_waited_for_a_cpu_and_one_late_alone_is_emulation(
        ) -> None:
    """A slowed worker (2x) whose stretch overshot by 1 ms in steps 6 and 8: in step 6 its
    sleep waited that 1 ms for a CPU to wake on (a wait for a CPU, as any: preempted, with
    no load outside the run), in step 8 its timer woke it late (the emulation's own). The
    stretch's own CPU time is not the natural compute's."""
    steps = steps_frame(30, lambda r, s: 2.0 if r == 0 else 8.0 + (1.0 if s in (6, 8) else 0),
                        edit=overshot)
    a = attribute(steps.assign(others_cores=0.0, steal_cores=0.0),
                  slowdown={1: 2.0}).set_index("step")
    assert a.loc[6, "cause"] == "preempted" and a.loc[6, "preempted_ms"] == pytest.approx(1.0)
    assert a.loc[6, "emulation_ms"] == pytest.approx(0.0, abs=1e-9)
    assert a.loc[8, "cause"] == "emulation" and a.loc[8, "emulation_ms"] == pytest.approx(1.0)
    assert a.loc[8, "preempted_ms"] == 0
    breakdown = compute_breakdown(steps).set_index("rank")
    assert breakdown.loc[1, "blocked_share"] == pytest.approx(0.0, abs=1e-9)
    shares = cause_shares(a.reset_index())
    assert shares[shares["rank"] == -1]["share"].sum() == pytest.approx(1.0)


def test_a_jittered_step_names_the_jitter_and_the_rest_of_its_lateness_apart() -> None:
    """Worker 1 jitters (a 3x factor on a seeded fifth of its steps: emulation.factor_at) on
    a 2 ms natural compute; in one jittered step it also waited 1 ms more for a CPU. The
    jitter's extra stretch (2 x 2 ms) is `jitter`, the wait is still named apart."""
    from hetbench.harness.spec.emulation import factor_at
    from hetbench.harness.spec.workers import WorkerSpec

    jittery = WorkerSpec(jitter=(0.2, 3.0))
    factors = [factor_at(jittery, s, 0, 1) for s in range(40)]
    hit = [s for s, f in enumerate(factors) if f > 1]
    assert 3 <= len(hit) <= 15  # seeded: the draw is the emulation's, fixed
    waited = hit[1]

    def kernel_counts(rows: np.ndarray) -> None:
        for name in COUNTED_LATER:
            rows[name] = 0
        for row in rows:
            row["compute_cpu_ns"] = 2 * MS
            if row["rank"] == 1:
                row["stretch_ns"] = int((factors[row["step"]] - 1) * 2 * MS)
                if row["step"] == waited:
                    row["compute_wait_ns"] = MS

    steps = steps_frame(40, lambda r, s: 1.0 if r == 0 else 2.0 * factors[s]
                        + (1.0 if s == waited else 0.0), edit=kernel_counts)
    steps.loc[steps["rank"] == 0, "compute_cpu_ns"] = MS
    manifest = {"run": {"seed": 0, "workers": [{}, {"jitter": [0.2, 3.0]}]}}
    a = attribute(steps.assign(others_cores=0.0, steal_cores=0.0),
                  manifest=manifest).set_index("step")
    for step in hit:
        assert a.loc[step, "cause"] == "jitter", a.loc[step].to_dict()
        assert a.loc[step, "jitter_ms"] == pytest.approx(4.0, rel=1e-6)
    assert a.loc[waited, "excess_ms"] == pytest.approx(5.0, rel=1e-6)
    assert a.loc[waited, "preempted_ms"] == pytest.approx(1.0, rel=1e-6)
    shares = cause_shares(a.reset_index()).query("rank == -1").set_index("cause")["share"]
    assert shares["jitter"] == pytest.approx(4.0 * len(hit) / (4.0 * len(hit) + 1.0), rel=1e-6)


def test_time_asleep_in_a_load_phase_above_its_median_is_load_not_blocked() -> None:
    """Worker 1's step 9 is 2 ms late, asleep (LOST): in step 9 of a second run the 2 ms
    are its load phase's (its DataLoader started again), named load where the run loads
    through a DataLoader; the first run's stay blocked, its load phase as usual."""
    def restarted(rows: np.ndarray) -> None:
        counted(rows)
        for row in rows:
            row["load_ns"] = MS // 10
            if row["rank"] == 1 and row["step"] == 9:
                row["load_ns"] += 2 * MS

    steps = steps_frame(30, lambda r, s: 2.0 if r == 0 else TYPICAL_CPU + TYPICAL_WAIT
                        + LOST.get(s, ("", 0.0))[1], edit=restarted)
    steps = steps.assign(others_cores=0.0, steal_cores=0.0)
    loader = {"run": {"loader": {"workers": 2}, "workers": [{}, {}]}}
    a = attribute(steps, manifest=loader).set_index("step")
    assert a.loc[9, "cause"] == "load" and a.loc[9, "load_ms"] == pytest.approx(2.0)
    assert a.loc[9, "blocked_ms"] == pytest.approx(0.0, abs=1e-9)
    assert attribute(frame(others={}), manifest=loader).set_index("step").loc[9, "cause"] \
        == "blocked"
    # batches sliced in line (no DataLoader): the load phase is the step's own work
    assert attribute(steps).set_index("step").loc[9, "cause"] == "blocked"


def test_a_load_spike_beside_outside_load_is_load_asleep_and_interference_waiting() -> None:
    """Worker 1's step 9, beside a core busy outside the run: its load phase 5 ms above its
    median, 2 ms of them asleep (a batch not ready) and 3 ms waiting for a CPU. The time
    asleep is the input pipeline's; the wait for a CPU the others'."""
    def spiked(rows: np.ndarray) -> None:
        counted(rows)
        for row in rows:
            row["load_ns"] = MS // 10
            if row["rank"] == 1 and row["step"] == 9:
                row["load_ns"] += 5 * MS
                row["compute_wait_ns"] += 3 * MS

    steps = steps_frame(30, lambda r, s: 2.0 if r == 0 else TYPICAL_CPU + TYPICAL_WAIT
                        + LOST.get(s, ("", 0.0))[1] + (3.0 if s == 9 else 0.0), edit=spiked)
    steps = steps.assign(others_cores=steps["step"].map({9: 1.0}).fillna(0.0),
                         steal_cores=0.0)
    loader = {"run": {"loader": {"workers": 2}, "workers": [{}, {}]}}
    a = attribute(steps, manifest=loader).set_index("step")
    assert a.loc[9, "load_ms"] == pytest.approx(2.0)
    assert a.loc[9, "interference_ms"] == pytest.approx(3.0)
    assert a.loc[9, "blocked_ms"] == pytest.approx(0.0, abs=1e-9)
    assert a.loc[9, "cause"] == "interference"
    # without a DataLoader the same sleep is blocked
    assert attribute(steps).set_index("step").loc[9, "blocked_ms"] == pytest.approx(2.0)


def test_a_stretch_late_beside_outside_load_is_interference() -> None:
    """The same overshoot in step 8 while 0.5 cores were busy outside the run (or stolen by
    the hypervisor, which the guest never counts as a wait): interference."""
    steps = steps_frame(30, lambda r, s: 2.0 if r == 0 else 8.0 + (1.0 if s in (6, 8) else 0),
                        edit=overshot)
    outside = steps["step"].map({8: 0.5}).fillna(0.0)
    a = attribute(steps.assign(others_cores=0.0, steal_cores=outside),
                  slowdown={1: 2.0}).set_index("step")
    assert a.loc[8, "cause"] == "interference"
    assert a.loc[8, "interference_ms"] == pytest.approx(1.0) and a.loc[8, "emulation_ms"] == 0
