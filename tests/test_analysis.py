"""Analysis on hand-built records whose answers are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.measures.stragglers import CAUSES, attribute, cause_shares, straggler_summary
from hetbench.analysis.measures.whatif import costs, what_if
from hetbench.analysis.tables.runs import group_table, runs_table
from hetbench.analysis.trends.persistence import autocorrelation, change_points
from hetbench.analysis.view.metrics import (
    heterogeneous_efficiency,
    phase_stats,
    step_metrics,
    worker_idle,
)
from hetbench.harness.records.results import Run
from tests.synthetic import MS, steps_frame


def test_step_metrics_follow_the_design_definitions() -> None:
    # Three workers: 2, 5, 3 ms; worker 1 is the straggler, 2 ms ahead of worker 2.
    frame = steps_frame(4, lambda r, s: [2.0, 5.0, 3.0][r], world=3)
    per_step = step_metrics(frame)
    assert per_step["straggler"].tolist() == [1, 1, 1, 1]
    np.testing.assert_allclose(per_step["lead_ms"], 2.0)
    np.testing.assert_allclose(per_step["spread_ms"], 3.0)
    np.testing.assert_allclose(per_step["imbalance"], 5.0 / (10.0 / 3) - 1)
    np.testing.assert_allclose(per_step["idle_ms"], 3.0 + 0.0 + 2.0)
    np.testing.assert_allclose(per_step["comm_ms"], 0.5)
    np.testing.assert_allclose(per_step["step_ms"], 5.0 + 0.5 + 0.1)
    idle = worker_idle(frame).set_index("rank")
    np.testing.assert_allclose(idle.loc[0, "idle_mean_ms"], 3.0)
    np.testing.assert_allclose(idle.loc[1, "idle_fraction"], 0.0)


def test_phase_stats_cv_and_tail_ratios() -> None:
    # Worker 0 alternates 1 and 3 ms; worker 1 is constant: CV 0 and tail ratios 1.
    frame = steps_frame(100, lambda r, s: (1.0 if s % 2 else 3.0) if r == 0 else 2.0)
    stats = phase_stats(frame).set_index(["rank", "phase"])
    assert stats.loc[(1, "compute"), "cv"] == pytest.approx(0.0)
    assert stats.loc[(1, "compute"), "p99_p50"] == pytest.approx(1.0)
    assert stats.loc[(0, "compute"), "mean_ms"] == pytest.approx(2.0)
    assert stats.loc[(0, "compute"), "cv"] == pytest.approx(np.std([1, 3] * 50, ddof=1) / 2)
    assert stats.loc[(0, "forward"), "p50_ms"] == pytest.approx(0.8)
    assert set(stats.index.get_level_values("phase")) >= {"load", "allreduce", "idle", "comm"}


def test_warmup_steps_are_left_out() -> None:
    frame = steps_frame(20, lambda r, s: 50.0 if s < 5 else 2.0)
    assert phase_stats(frame, warmup_steps=5).set_index(["rank", "phase"]).loc[
        (0, "compute"), "p99_ms"] == pytest.approx(2.0)


def gc_and_preemption(rows: np.ndarray) -> None:
    """Worker 1 (the straggler): 3 ms of GC in steps 5 and 9; 2 ms off the CPU with many
    involuntary context switches in step 7; 1.5 ms off the CPU, no switches, step 11."""
    for row in rows:
        if row["rank"] != 1:
            continue
        if row["step"] in (5, 9):
            row["gc_ns"] = 3 * MS
            row["compute_cpu_ns"] += 0  # the GC ran on the CPU, inside the measured time
        if row["step"] == 7:
            row["compute_cpu_ns"] -= 2 * MS
            row["ctx_involuntary"] = 40
        if row["step"] == 11:
            row["compute_cpu_ns"] -= int(1.5 * MS)


def test_straggler_excess_is_attributed_to_the_signal_that_explains_it() -> None:
    extra = {5: 3.0, 9: 3.0, 7: 2.0, 11: 1.5}
    frame = steps_frame(20, lambda r, s: 2.0 if r == 0 else 3.0 + extra.get(s, 0.0),
                        edit=gc_and_preemption)
    summary = straggler_summary(frame).set_index("rank")
    assert summary.loc[1, "share_last"] == 1.0 and summary.loc[0, "steps_last"] == 0
    assert summary.loc[1, "mean_lead_ms"] == pytest.approx(1.0 + np.mean(list(extra.values()))
                                                           * 4 / 20)
    a = attribute(frame).set_index("step")
    assert a.loc[5, "cause"] == "gc" and a.loc[5, "gc_ms"] == pytest.approx(3.0)
    assert a.loc[7, "cause"] == "preempted" and a.loc[7, "preempted_ms"] == pytest.approx(2.0)
    assert a.loc[11, "cause"] == "off_cpu" and a.loc[11, "off_cpu_ms"] == pytest.approx(1.5)
    assert a.loc[3, "cause"] == "none" and a.loc[3, "excess_ms"] == 0
    parts = a[[f"{c}_ms" for c in CAUSES]].sum(axis=1)
    np.testing.assert_allclose(parts, a["excess_ms"], atol=1e-9)
    shares = cause_shares(attribute(frame))
    everyone = shares[shares["rank"] == -1].set_index("cause")["share"]
    assert everyone.sum() == pytest.approx(1.0)
    assert everyone["gc"] == pytest.approx(6.0 / 9.5)
    assert everyone["unexplained"] == pytest.approx(0.0, abs=1e-9)


def test_off_cpu_time_while_other_processes_took_the_cores_is_interference() -> None:
    """The same preempted step 7 and off-CPU step 11 as above, and a step 15 with 1 ms more
    CPU time; the host's samples say that processes outside the run kept 1.5 more cores
    busy during steps 7 and 15 (and 13, where worker 1 lost nothing: nothing to attribute)."""
    extra = {5: 3.0, 9: 3.0, 7: 2.0, 11: 1.5, 15: 1.0}
    frame = steps_frame(20, lambda r, s: 2.0 if r == 0 else 3.0 + extra.get(s, 0.0),
                        edit=gc_and_preemption)
    others = frame["step"].map({7: 1.6, 13: 1.6, 15: 1.6}).fillna(0.1)
    frame = frame.assign(others_cores=others, steal_cores=0.0)
    a = attribute(frame).set_index("step")
    assert a.loc[7, "cause"] == "interference"
    assert a.loc[7, "interference_ms"] == pytest.approx(2.0) and a.loc[7, "preempted_ms"] == 0
    # running slower beside another process (more CPU time) is interference too
    assert a.loc[15, "cause"] == "interference" and a.loc[15, "on_cpu_ms"] == 0
    assert a.loc[15, "interference_ms"] == pytest.approx(1.0)
    assert a.loc[11, "cause"] == "off_cpu" and a.loc[11, "interference_ms"] == 0
    assert a.loc[13, "cause"] == "none"
    quiet = attribute(frame.assign(others_cores=0.1)).set_index("step")
    assert quiet.loc[15, "cause"] == "on_cpu" and quiet.loc[7, "cause"] == "preempted"
    # the hypervisor's steal counts as interference too
    stolen = frame.assign(others_cores=0.1, steal_cores=frame["step"].map({11: 0.5}).fillna(0.0))
    b = attribute(stolen).set_index("step")
    assert b.loc[11, "cause"] == "interference" and b.loc[7, "cause"] == "preempted"


def test_more_cpu_time_while_the_clock_ran_slow_is_frequency() -> None:
    """Worker 1 computes 3 ms on the CPU; in step 6 its cores ran at 2000 instead of 2600
    MHz and the step took 3.9 ms of CPU time (3 x 2600 / 2000), in step 12 the clock held
    and it took 1 ms more (no signal: on_cpu), in step 16 the clock dropped by 2% only."""
    extra = {6: 0.9, 12: 1.0, 16: 1.0}
    frame = steps_frame(20, lambda r, s: 2.0 if r == 0 else 3.0 + extra.get(s, 0.0))
    mhz = frame["step"].map({6: 2000.0, 16: 2548.0}).fillna(2600.0)
    frame = frame.assign(others_cores=0.1, steal_cores=0.0, cpu_mhz=mhz)
    a = attribute(frame).set_index("step")
    # 3.9 ms of CPU time at 2000 / 2600 of the clock: 3.9 x (1 - 2000 / 2600) = 0.9 ms
    assert a.loc[6, "cause"] == "frequency"
    assert a.loc[6, "frequency_ms"] == pytest.approx(0.9) and a.loc[6, "on_cpu_ms"] == \
        pytest.approx(0.0, abs=1e-9)
    assert a.loc[12, "cause"] == "on_cpu" and a.loc[12, "frequency_ms"] == 0
    assert a.loc[16, "cause"] == "on_cpu" and a.loc[16, "frequency_ms"] == 0  # 2% < 5%
    # a clock not shown (NaN, as in most VMs) is no evidence
    unknown = attribute(frame.assign(cpu_mhz=np.nan)).set_index("step")
    assert unknown.loc[6, "cause"] == "on_cpu" and unknown.loc[6, "frequency_ms"] == 0
    # other processes busy in that step: interference takes it all, as before
    busy = attribute(frame.assign(others_cores=frame["step"].map({6: 1.6}).fillna(0.1)))
    assert busy.set_index("step").loc[6, "cause"] == "interference"


def test_host_samples_are_joined_to_each_step_by_time() -> None:
    """Samples at 100, 200 and 300 ms with others busy on 1 core only between 100 and 200:
    a step inside that interval gets 1.0, one straddling its start 0.5 (half of it), one
    beyond the last sample NaN."""
    import pandas as pd

    from hetbench.harness.system.sampler import join_to_steps

    samples = pd.DataFrame({"t_ns": [100 * MS, 200 * MS, 300 * MS],
                            "others_cores": [0.0, 1.0, 0.0], "steal_cores": [0.0, 0.0, 0.5],
                            "cpu_mhz": [2600.0, 2000.0, 2600.0]})
    steps = pd.DataFrame({"begin_ns": [120 * MS, 50 * MS, 250 * MS, 210 * MS],
                          "ready_ns": [150 * MS, 150 * MS, 350 * MS, 290 * MS]})
    joined = join_to_steps(steps, samples)
    assert joined["others_cores"].tolist()[:2] == pytest.approx([1.0, 0.5])
    assert np.isnan(joined["others_cores"][2]) and joined["others_cores"][3] == 0.0
    assert joined["steal_cores"][3] == pytest.approx(0.5)
    # the clock is a level, averaged the same way: 30 ms at 2000 MHz, 50 / 50 with 2600
    assert joined["cpu_mhz"].tolist()[:2] == pytest.approx([2000.0, 2300.0])


def test_unmeasured_excess_stays_unexplained_and_names_no_cause() -> None:
    frame = steps_frame(20, lambda r, s: 2.0 if r == 0 else (6.0 if s == 4 else 3.0),
                        edit=lambda rows: rows["compute_cpu_ns"].__setitem__(Ellipsis, 0))
    a = attribute(frame).set_index("step")  # no CPU time recorded: only gc is measurable
    assert a.loc[4, "excess_ms"] == pytest.approx(3.0)
    assert a.loc[4, "unexplained_ms"] == pytest.approx(3.0)
    assert a.loc[4, "cause"] == "none"


def test_emulated_slowdown_multiplies_natural_delays_and_overshoot_is_its_own_cause() -> None:
    def stretched(rows: np.ndarray) -> None:
        for row in rows:  # (a boolean mask would give copies)
            if row["rank"] != 1:
                continue
            natural = 1.5 * MS
            row["stretch_ns"] = int(natural)  # slowdown 2: stretch = (2 - 1) x natural
            row["compute_cpu_ns"] = int(natural)
            if row["step"] == 6:  # 1 ms preempted, stretched to 2 ms
                row["compute_cpu_ns"] -= MS
                row["ctx_involuntary"] = 9
            if row["step"] == 8:  # the sleep overshot by 1 ms
                row["stretch_ns"] += MS
    frame = steps_frame(20, lambda r, s: 1.0 if r == 0 else 3.0 + (1.0 if s in (6, 8) else 0),
                        edit=stretched)
    a = attribute(frame, slowdown={1: 2.0}).set_index("step")
    assert a.loc[6, "preempted_ms"] == pytest.approx(1.0)  # capped at the 1 ms excess
    assert a.loc[8, "emulation_ms"] == pytest.approx(1.0) and a.loc[8, "cause"] == "emulation"


def test_a_scheduled_slowdown_is_not_straggler_excess() -> None:
    # worker 1 emulates 1x until step 19, 3x from step 20 (2 ms natural, 6 ms after); on
    # step 30 it is 1 ms slower than that
    def ms(r: int, s: int) -> float:
        if r == 0:
            return 1.0
        return (6.0 if s >= 20 else 2.0) + (1.0 if s == 30 else 0.0)

    frame = steps_frame(40, ms)
    schedule = {"run": {"seed": 0, "workers": [
        {"slowdown": 1.0}, {"slowdown_at": [[19, 1.0], [20, 3.0]]}]}}
    a = attribute(frame, manifest=schedule).set_index("step")
    assert a.loc[30, "excess_ms"] == pytest.approx(1.0, abs=0.01)
    assert a.drop(index=30)["excess_ms"].max() == pytest.approx(0.0, abs=0.01)
    # read without the schedule, every step after the jump looks slow
    unaware = attribute(frame).set_index("step")
    assert (unaware.loc[21:39, "excess_ms"] > 1.0).all()


def test_change_points_find_a_shift_and_not_noise() -> None:
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.05, size=(2, 300))
    frame = steps_frame(300, lambda r, s: (2.0 if r == 1 or s < 180 else 3.0) + noise[r, s])
    cps = change_points(frame)
    assert cps["rank"].tolist() == [0]
    assert abs(cps["step"].iloc[0] - 180) <= 3
    assert cps["before_ms"].iloc[0] == pytest.approx(2.0, abs=0.05)
    assert cps["after_ms"].iloc[0] == pytest.approx(3.0, abs=0.05)


def test_autocorrelation_tells_persistent_from_independent_noise() -> None:
    rng = np.random.default_rng(1)
    walk = np.cumsum(rng.normal(0, 0.05, 400))  # slow steps follow slow steps
    white = rng.normal(0, 0.05, 400)
    frame = steps_frame(400, lambda r, s: 3.0 + (walk[s] if r == 0 else white[s]))
    acf = autocorrelation(frame).set_index(["rank", "lag"])["acf"]
    assert acf[(0, 1)] > 0.8
    assert abs(acf[(1, 1)]) < 0.15


def test_what_if_separates_variability_from_imbalance() -> None:
    steady = steps_frame(50, lambda r, s: [2.0, 4.0][r], batch=lambda r: 32)
    c = costs(what_if(steady))
    assert c["cost_of_variability"] == pytest.approx(0.0, abs=1e-9)
    # Balanced: both at 3 ms (rates 16 and 8 samples/ms -> 64 samples in 2.667 ms).
    t = what_if(steady).set_index("scenario")["total_s"]
    assert t["balanced"] == pytest.approx(50 * (64 / 24 + 0.6) / 1000, rel=1e-6)
    # Fastest: both at worker 0's 2 ms per 32 samples; medians take 4.6 ms a step, 2.6 then.
    assert c["cost_of_heterogeneity"] == pytest.approx(4.6 / 2.6 - 1, rel=1e-6)
    noisy = steps_frame(50, lambda r, s: [2.0, 4.0 + (2.0 if s % 5 == 0 else 0.0)][r])
    assert costs(what_if(noisy))["cost_of_variability"] == pytest.approx(
        (10 * 2.0) / (50 * 4.6), rel=1e-6)


def test_what_if_reads_changing_slices_and_slowdowns_through_the_cost_model() -> None:
    # worker 0: 1 ms + 0.1 ms per sample; its slice moves from 32 to 16 at step 25 (a
    # repartition), and from step 40 its emulated slowdown is 2 (a schedule): steady
    # otherwise, so there is no variability to cost
    def sizes(rows: np.ndarray) -> None:
        late = rows["step"] >= 25
        rows["batch_size"] = np.where(rows["rank"] == 0, np.where(late, 16, 32), 32)

    def ms(r: int, s: int) -> float:
        if r == 1:
            return 4.0
        return (1.0 + 0.1 * (16 if s >= 25 else 32)) * (2.0 if s >= 40 else 1.0)

    frame = steps_frame(60, ms, edit=sizes)
    schedule = {"run": {"seed": 0, "workers": [
        {"slowdown_at": [[39, 1.0], [40, 2.0]]}, {"slowdown": 1.0}]}}
    assert costs(what_if(frame, 0, schedule))["cost_of_variability"] == pytest.approx(
        0.0, abs=1e-6)
    # nor does its variability against the cost model, though its compute time varies
    from hetbench.analysis.measures.costmodel import residual_cv

    assert residual_cv(frame, schedule).max() == pytest.approx(0.0, abs=1e-6)
    assert phase_stats(frame).query("phase == 'compute' and rank == 0")["cv"].iloc[0] > 0.2
    # read without the schedule, the jump looks like variability: worker 0's steps of 2.6
    # and 5.2 ms at 16 samples average 4.09 ms, which hides worker 1's 4 ms steps
    # (each step also spends 0.6 ms after the last arrival: exchange and update)
    actual = 25 * 4.2 + 15 * 4.0 + 20 * 5.2 + 60 * 0.6
    steady = 25 * 4.2 + (2.6 * 15 + 5.2 * 20) + 60 * 0.6
    assert costs(what_if(frame))["cost_of_variability"] == pytest.approx(actual / steady - 1,
                                                                          rel=1e-3)


def test_the_oracle_is_the_best_static_partition_of_the_fitted_models() -> None:
    from hetbench.analysis.measures.costmodel import oracle

    # 6 ms and 2 ms per 32 samples: the best static split is 16/48, 3 ms each
    equal = steps_frame(40, lambda r, s: [6.0, 2.0][r], batch=lambda r: 32)
    found = oracle(equal)
    assert found["oracle_sizes"] == [16, 48]
    assert found["oracle_step_ms"] == pytest.approx(3.0 + 0.6, rel=1e-3)
    assert found["oracle_efficiency"] == pytest.approx(3.6 / 6.6, rel=1e-3)
    # a run already at that split, with no variability, is as good as the oracle
    balanced = steps_frame(40, lambda r, s: 3.0, batch=lambda r: [16, 48][r])
    assert oracle(balanced)["oracle_efficiency"] == pytest.approx(1.0, rel=1e-3)


def test_runs_table_and_intervals_over_repeats() -> None:
    runs = []
    for repeat, ms in enumerate([2.0, 2.2, 2.4]):
        meta = {"run_id": f"a-r{repeat}", "repeat": repeat, "status": "completed",
                "heterogeneity": "emulated",
                "run": {"name": "a", "steps": 30, "warmup_steps": 0,
                        "partition": {"policy": "sizes"},
                        "workers": [{"device": "cpu"}, {"device": "cpu", "slowdown": 2.0}]},
                "standalone": [{"rank": 0, "samples_per_s": 1e4},
                               {"rank": 1, "samples_per_s": 1e4}]}
        runs.append(Run.of(meta, steps_frame(30, lambda r, s, ms=ms: ms * (1 + r))))
    table = runs_table(runs)
    assert table["devices"].iloc[0] == "cpu x1 + cpu x1 /2"
    assert not table["partial"].any()
    assert table["efficiency"].iloc[0] == pytest.approx(table["samples_per_s"].iloc[0] / 2e4)
    groups = group_table(table).set_index("metric")
    row = groups.loc["mean_step_ms"]
    assert row["n"] == 3 and row["ci_low"] < row["mean"] < row["ci_high"]
    single = group_table(table.head(1)).set_index("metric")
    assert np.isnan(single.loc["mean_step_ms", "ci_low"])


def test_efficiency_needs_standalone_rates() -> None:
    assert np.isnan(heterogeneous_efficiency(100.0, pd.DataFrame(columns=["samples_per_s"])))
    assert heterogeneous_efficiency(90.0, pd.DataFrame({"samples_per_s": [50.0, 50.0]})) == 0.9


def test_a_starved_input_pipeline_is_named_load_against_its_peers() -> None:
    """Worker 1 waits 1 ms on its input pipeline every step where worker 0 waits 0.1 ms
    for the same slice (0 DataLoader processes against 2): it is last every step, by a
    wait that is its typical one, so the excess over its own median holds none of it; the
    load cause measures it against its peer. In step 7 its load takes 2 ms more than
    usual: that spike is compute excess (on the CPU here), not counted twice."""
    def compute(rank: int, step: int) -> float:
        return 2.0 if rank == 0 else 2.9 + (2.0 if step == 7 else 0.0)

    def loads(rows: np.ndarray) -> None:
        for row in rows:
            load = (0.1 if row["rank"] == 0 else 1.0 + (2.0 if row["step"] == 7 else 0.0)) * MS
            row["load_ns"] = int(load)
            row["forward_ns"] -= int(load)

    frame = steps_frame(20, compute, edit=loads)
    a = attribute(frame, manifest={"run": {"loader": {"workers": 2},
                                           "workers": [{}, {}]}}).set_index("step")
    assert (a["rank"] == 1).all()
    assert (a.drop(index=7)["cause"] == "load").all()
    assert a.loc[7, "cause"] == "load"  # the spike is the input pipeline's too
    np.testing.assert_allclose(a.drop(index=7)["load_ms"], 0.9, atol=1e-6)
    assert a.loc[3, "excess_ms"] == pytest.approx(0.9, abs=1e-6)
    assert a.loc[7, "excess_ms"] == pytest.approx(2.9, abs=0.01)
    assert a.loc[7, "load_ms"] == pytest.approx(2.9, abs=0.01)
    assert a.loc[7, "on_cpu_ms"] == pytest.approx(0.0, abs=0.01)
    parts = a[[f"{c}_ms" for c in CAUSES]].sum(axis=1)
    np.testing.assert_allclose(parts, a["excess_ms"], atol=1e-9)
    # worker 1 with a slice three times worker 0's and the same pace per sample: no load
    # cause (its longer wait is its larger slice's)
    same_pace = steps_frame(20, lambda r, s: 2.0 if r == 0 else 4.0,
                            batch=lambda r: 16 if r == 0 else 48,
                            edit=lambda rows: [row.__setitem__(
                                "load_ns", int((0.1 if row["rank"] == 0 else 0.3) * MS))
                                for row in rows])
    assert (attribute(same_pace)["load_ms"] == 0).all()


def test_a_pipelines_stages_wait_only_for_the_ranks_holding_their_layers() -> None:
    """Two virtual workers of two stages: each stage all-reduces with its counterpart in
    the other virtual worker, not with the other stage, so stage 0 may finish its exchange
    before stage 1 is ready (the communication share came out negative)."""
    from hetbench.analysis.view.metrics import busy_shares, with_derived

    reduced = {0: 16, 1: 33}  # each stage's exchange ends together, stage 0's first
    rows = [{"rank": rank, "step": 0, "virtual_worker": vw, "stage": stage, "begin_ns": 0,
             "ready_ns": ready * MS, "reduced_ns": reduced[stage] * MS, "end_ns": 40 * MS}
            for rank, (vw, stage, ready) in enumerate([(0, 0, 10), (0, 1, 30), (1, 0, 14),
                                                       (1, 1, 32)])]
    derived = with_derived(pd.DataFrame(rows))
    # stage 0 met at 14 ms (rank 2's ready), stage 1 at 32 (rank 3's)
    assert derived["idle_ns"].tolist() == [4 * MS, 2 * MS, 0, 0]
    assert derived["comm_ns"].tolist() == [2 * MS, 1 * MS, 2 * MS, 1 * MS]
    shares = busy_shares(pd.DataFrame(rows))
    assert shares["comm_share"] == pytest.approx(6 / 160)
    assert shares["idle_fraction"] == pytest.approx(6 / 160)
