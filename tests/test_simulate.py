"""The scale-out simulator (analysis/models/simulate.py, analysis/models/deviceclass.py): fitted
classes, the schemes' timing on cases with known answers, the summary against the analysis of the
records it writes, and the residual process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.models import deviceclass, simulate
from hetbench.analysis.models.deviceclass import CommModel, Source
from hetbench.analysis.view.metrics import run_summary, step_metrics
from hetbench.harness.records import collector
from hetbench.harness.records.results import Run
from hetbench.harness.spec.workers import WorkerSpec
from tests.synthetic import MS, steps_frame

PARAMETERS = 1000


def recorded(frame: pd.DataFrame, slowdowns: tuple[float, ...] = (1.0, 1.0),
             name: str = "pair", run_id: str = "pair-r0") -> tuple[dict[str, Any], pd.DataFrame]:
    """A (manifest, steps) pair as load_run gives it, for records built by hand."""
    workers = [{"device": "cpu", "threads": 1, "slowdown": f, "framework": "pytorch",
                "slowdown_at": None, "jitter": None} for f in slowdowns]
    meta = {"run_id": run_id, "status": "completed", "suite": {"name": "synthetic"},
            "run": {"name": name, "framework": "pytorch", "workload": "mlp",
                    "dataset": "digits", "size": "small", "steps": int(frame["step"].nunique()),
                    "warmup_steps": 0, "global_batch": int(frame.groupby("step")[
                        "batch_size"].sum().iloc[0]), "instrument": True, "seed": 0,
                    "partition": {"policy": "sizes"}, "aggregator": {"name": "torch"},
                    "workers": workers},
            "workers": [{"rank": r, "label": f"pytorch cpu x1 slowdown {f:g}" if f != 1 else
                         "pytorch cpu x1", "parameters": PARAMETERS}
                        for r, f in enumerate(slowdowns)]}
    return meta, frame


def steady_pair() -> tuple[dict[str, Any], pd.DataFrame]:
    """Worker 0 computes 6 ms, worker 1 2 ms, every step; exchange 0.5 ms, update 0.1 ms,
    10 us between steps (tests/synthetic.py)."""
    return recorded(steps_frame(64, lambda r, s: [6.0, 2.0][r], batch=lambda r: 32))


def as_runs(pairs: Sequence[tuple[dict[str, Any], pd.DataFrame]]) -> list[Run]:
    return [Run.of(meta, frame) for meta, frame in pairs]


def classes_of(*runs: tuple[dict[str, Any], pd.DataFrame]):  # type: ignore[no-untyped-def]
    classes, names = deviceclass.fit_classes(as_runs(runs))
    return classes, names, deviceclass.fit_comm(as_runs(runs))


def workers(mix: str, runs: list[tuple[dict[str, Any], pd.DataFrame]]) -> list[Any]:
    classes, names = deviceclass.fit_classes(as_runs(runs))
    return deviceclass.resolve_mix(deviceclass.parse_mix(mix), classes, names)[0]


# -- fitting --------------------------------------------------------------------------------


def test_a_starved_slow_worker_shares_its_hardware_line() -> None:
    """An adaptive policy left the 10x worker one sample a step: its line comes from every
    worker of the same hardware (real compute 0.5 ms + 0.04 ms per sample), not from the
    line through the origin and its one point (0.54 ms per sample)."""
    real = [0.5 + 0.04 * 63, 0.5 + 0.04 * 1]
    classes, names, _ = classes_of(recorded(
        steps_frame(40, lambda r, s: real[r] * [1.0, 10.0][r], batch=lambda r: [63, 1][r]),
        slowdowns=(1.0, 10.0)))
    slow = classes[names["cpu-10x"]]
    assert slow.line.a_ns == pytest.approx(0.5e6, rel=0.01)
    assert slow.line.b_ns == pytest.approx(0.04e6, rel=0.01)
    assert classes[names["cpu"]].line == slow.line


def test_classes_answer_to_rank_label_and_short_name() -> None:
    classes, names, _ = classes_of(recorded(steps_frame(
        16, lambda r, s: [6.0, 2.0][r]), slowdowns=(3.0, 1.0)))
    assert names["rank0"] == names["cpu-3x"] == names["pytorch cpu x1 slowdown 3"]
    assert names["rank1"] == names["cpu"] == "pytorch cpu x1"
    slow = classes[names["cpu-3x"]]
    # 6 ms over 32 samples at slowdown 3: 62.5 us per sample before the slowdown
    assert slow.line.a_ns == 0 and slow.line.b_ns == pytest.approx(6 * MS / 32 / 3)
    assert slow.residuals() == pytest.approx(np.ones(16))


def test_a_line_is_fitted_over_the_slices_of_every_run_given() -> None:
    # 1 ms fixed + 0.1 ms per sample, seen at 20 and 60 samples in two runs
    line = lambda n: 1.0 + 0.1 * n  # noqa: E731
    a = recorded(steps_frame(16, lambda r, s: line(20), batch=lambda r: 20), run_id="a")
    b = recorded(steps_frame(16, lambda r, s: line(60), batch=lambda r: 60), run_id="b")
    classes, names, _ = classes_of(a, b)
    fitted = classes[names["cpu"]].line
    assert fitted.a_ns == pytest.approx(1 * MS, rel=1e-3)
    assert fitted.b_ns == pytest.approx(0.1 * MS, rel=1e-3)
    assert len(classes[names["cpu"]].sources) == 4  # two workers in each of two runs


def test_the_ring_model_is_recovered_from_two_world_sizes() -> None:
    alpha, beta = 40_000.0, 2.0  # ns, ns per byte
    truth = CommModel(alpha, beta, 4 * (PARAMETERS + 1), "")
    runs = []
    for world in (2, 4):
        frame = steps_frame(16, lambda r, s: 3.0, world=world,
                            comm_ms=truth.allreduce_ns(world) / MS)
        meta, _ = recorded(frame, slowdowns=(1.0,) * world, run_id=f"w{world}")
        runs.append(Run.of(meta, frame))
    fitted = deviceclass.fit_comm(runs)
    assert fitted.alpha_ns == pytest.approx(alpha, rel=1e-2)
    assert fitted.beta_ns_per_byte == pytest.approx(beta, rel=1e-2)
    assert fitted.allreduce_ns(64) == pytest.approx(truth.allreduce_ns(64), rel=1e-2)


def test_runs_that_cannot_be_fitted_are_refused_by_name() -> None:
    from hetbench.harness.spec.errors import UsageError

    meta, frame = steady_pair()
    with pytest.raises(UsageError, match="status failed"):
        deviceclass.fit_classes([Run.of({**meta, "status": "failed"}, frame)])
    asynchronous = frame.assign(asynchronous=True)
    with pytest.raises(UsageError, match="asynchronous scheme"):
        deviceclass.fit_classes([Run.of(meta, asynchronous)])
    cnn = {**meta, "run": {**meta["run"], "workload": "cnn"}, "run_id": "other"}
    with pytest.raises(UsageError, match="more than one workload"):
        deviceclass.fit_classes([Run.of(meta, frame), Run.of(cnn, frame)])
    with pytest.raises(UsageError, match="no device class or profile 'gpu'"):
        workers("gpu:4", [steady_pair()])
    for bad in ("cpu", "cpu:0", "cpu:x", ":3"):
        with pytest.raises(UsageError, match="--mix"):
            deviceclass.parse_mix(bad)


# -- schemes on known answers -----------------------------------------------------------------


def test_bsp_of_the_recorded_pair_gives_its_step_time() -> None:
    run = steady_pair()
    _, _, comm = classes_of(run)
    sim = simulate.simulate(workers("rank0:1,rank1:1", [run]), comm,
                            simulate.Scheme("bsp"), 50, 64)
    # the last arrival at 6 ms, the exchange 0.5 ms, the update 0.1 ms, 10 us to the next
    period = (6.0 + 0.5 + 0.1 + 0.01) * MS
    assert np.diff(sim.ready.max(axis=1)) == pytest.approx(np.full(49, period))
    summary = simulate.summarise(sim)
    assert summary["mean_step_ms"] == pytest.approx(6.6, abs=0.02)
    assert summary["idle_fraction"] == pytest.approx(4.0 / 6.6 / 2, rel=0.02)
    assert summary["samples_per_s"] == pytest.approx(64 / period * 1e9 * 50 / 49.9, rel=0.01)


def test_profiled_slices_balance_a_worker_three_times_slower() -> None:
    run = steady_pair()
    _, _, comm = classes_of(run)
    sim = simulate.simulate(workers("rank0:1,rank1:1", [run]), comm,
                            simulate.Scheme("bsp-profiled"), 20, 64)
    assert sim.sizes[0].tolist() == [16, 48]  # throughputs 32/6 and 32/2: 1 to 3
    assert simulate.summarise(sim)["idle_fraction"] < 0.01


def test_ssp_with_bound_zero_waits_for_the_slow_worker_and_async_does_not() -> None:
    run = steady_pair()
    _, _, comm = classes_of(run)
    pair = workers("rank0:1,rank1:1", [run])
    ssp = simulate.simulate(pair, comm, simulate.Scheme("ssp", 0), 40, 64)
    # the fast worker (rank 1) waits 4 ms for the slow one's push, every step
    assert np.median(ssp.wait[5:, 1]) == pytest.approx(4 * MS, rel=0.02)
    assert np.median(ssp.wait[5:, 0]) == pytest.approx(0, abs=1e3)
    # transfers that take no time: each worker on its own clock, 50 us each way
    instant = CommModel(50_000.0, 0.0, comm.bytes, "")
    free = simulate.simulate(pair, instant, simulate.Scheme("ps-async"), 40, 64)
    steps_taken = free.kept.sum(axis=0)
    # compute, 0.1 ms round trip, the server's update (0.1 ms: the fitted time after the
    # all-reduce), the worker's load of the parameters (0.1 ms: its apply phase), 10 us to
    # the next step
    assert steps_taken[1] / steps_taken[0] == pytest.approx(6.31 / 2.31, rel=0.05)
    assert np.median(np.diff(free.begin[:20, 1])) == pytest.approx(2.31 * MS)
    # between two of the slow worker's pushes the fast one pushes about 2.8 times
    assert simulate.summarise(free)["mean_staleness"] > 0.5
    # s = 1 lets the fast worker one step ahead: less waiting than s = 0
    ssp1 = simulate.simulate(pair, comm, simulate.Scheme("ssp", 1), 40, 64)
    assert simulate.summarise(ssp1)["samples_per_s"] >= simulate.summarise(ssp)["samples_per_s"]


@pytest.mark.parametrize("bound", [0, 1, 2, 4])
def test_ssp_serves_pushes_as_they_come_and_holds_the_fast_worker_s_clocks_ahead(
        bound: int) -> None:
    """As the real server: a push of clock c is answered once every worker has pushed
    c - S, pushes of any clock served as they arrive. So when the slow worker (3x) pushes
    clock c, the fast one has pushed clocks 0 .. c + S and no more; the run ends once 40
    global batches are served, the fast worker having taken more steps once S > 0."""
    run = steady_pair()
    _, _, comm = classes_of(run)
    sim = simulate.simulate(workers("rank0:1,rank1:1", [run]), comm,
                            simulate.Scheme("ssp", bound), 40, 64)
    slow, fast = (sim.ready[:, r][sim.kept[:, r]] for r in (0, 1))
    ahead = [int((fast < t).sum()) - c for c, t in enumerate(slow)]  # fast pushes - c
    assert max(ahead) == bound + 1 and ahead[-1] == bound + 1
    steps = sim.kept.sum(axis=0)
    assert steps.sum() == 80  # two equal slices of 32: 40 global batches
    assert (steps[1] > steps[0]) == (bound > 0)


def test_backup_workers_drop_the_slowest_and_none_without_backups() -> None:
    run = recorded(steps_frame(64, lambda r, s: [6.0, 2.0, 2.0, 2.0][r], world=4),
                   slowdowns=(3.0, 1.0, 1.0, 1.0))
    _, _, comm = classes_of(run)
    four = workers("rank0:1,rank1:3", [run])
    none = simulate.simulate(four, comm, simulate.Scheme("backup", 0), 30, 128)
    assert not none.dropped[none.kept].any()
    one = simulate.simulate(four, comm, simulate.Scheme("backup", 1), 30, 128)
    assert one.dropped[one.kept][:, ].sum() > 0
    assert not one.dropped[:, 1:][one.kept[:, 1:]].any()  # only the slow worker is dropped
    assert simulate.summarise(one)["mean_step_ms"] < simulate.summarise(none)["mean_step_ms"]
    # each worker numbers its steps by the version it computed on, as a real backup run
    # does: the fast ones take every version, the slow one skips those it was dropped past
    numbers = [one.step_number[one.kept[:, w], w] for w in range(4)]
    for fast in numbers[1:]:
        assert fast.tolist() == list(range(len(fast)))
    assert (np.diff(numbers[0]) >= 1).all() and (np.diff(numbers[0]) > 1).any()
    # so a step of the records spans the computes of one version (begun within a step of
    # each other), not rows of the workers' own counts, ever further apart in time
    frame = collector.records_frame([simulate.records(one)])
    per_worker = (one.end - one.begin)[one.kept].max()
    assert step_metrics(frame)["step_ms"].max() * 1e6 <= 2 * per_worker


def test_local_sgd_all_reduces_every_h_steps() -> None:
    run = steady_pair()
    _, _, comm = classes_of(run)
    sim = simulate.simulate(workers("rank0:1,rank1:1", [run]), comm,
                            simulate.Scheme("local-sgd", 4), 16, 64)
    assert (~sim.asynchronous).sum(axis=1).tolist() == [0, 0, 0, 2] * 4
    # between averages the fast worker is not held back: it waits at the average only
    assert sim.ready[3, 1] < sim.ready[3, 0]


@pytest.mark.parametrize("scheme", ["bsp", "bsp-profiled", "bsp-adaptive", "ps-sync",
                                    "backup:1", "ssp:2", "ps-async", "local-sgd:3"])
def test_the_summary_is_what_the_analysis_reads_off_the_records(scheme: str) -> None:
    rng = np.random.default_rng(3)
    noise = rng.lognormal(0, 0.3, size=(80, 3))
    run = recorded(steps_frame(80, lambda r, s: [6.0, 2.0, 3.0][r] * noise[s, r], world=3),
                   slowdowns=(3.0, 1.0, 1.5))
    _, _, comm = classes_of(run)
    sim = simulate.simulate(workers("rank0:2,rank1:3,rank2:1", [run]), comm,
                            simulate.parse_scheme(scheme), 60, 192, seed=1)
    frame = collector.records_frame([simulate.records(sim)])
    from hetbench.harness.records.results import step_problem

    assert step_problem(frame) is None
    mine, theirs = simulate.summarise(sim), run_summary(frame)
    for key in ("samples_per_s", "mean_step_ms", "idle_fraction", "compute_share",
                "comm_share", "steps"):
        assert mine[key] == pytest.approx(theirs[key], rel=1e-6), key


# -- the residual process -------------------------------------------------------------------


def test_blocks_keep_autocorrelation_and_each_worker_its_own_level() -> None:
    # two recorded workers of one class: one steady at 1, one in slow spells of 20 steps
    steps = 400
    spells = np.where((np.arange(steps) // 20) % 2 == 0, 1.0, 2.0)
    base = np.ones(steps)
    sources = (Source(base, np.zeros(steps), np.zeros(steps), "a", 0),
               Source(spells, np.zeros(steps), np.zeros(steps), "a", 1))
    cls = deviceclass.DeviceClass("cpu", "cpu", deviceclass.Line(0, 1e5),
                                  WorkerSpec(),
                                  sources, (0.0, 0.0, 0.5, 0.5, 0.0))
    residual, *_ = simulate.draw([cls] * 4, 2000, np.random.default_rng(0))
    # workers 0 and 2 keep to the steady source, 1 and 3 to the spells
    assert residual[:, [0, 2]] == pytest.approx(np.ones((2000, 2)))
    spelled = residual[:, 1]
    lag1 = np.corrcoef(spelled[:-1], spelled[1:])[0, 1]
    assert lag1 > 0.8  # an independent resample would give about 0
    assert spelled.mean() == pytest.approx(1.5, abs=0.1)


def test_each_recorded_repeat_keeps_the_level_of_its_exchange() -> None:
    # two repeats of one pair, alike but for the exchange: 0.5 ms, and 2 ms on a busy host
    fast = recorded(steps_frame(64, lambda r, s: [6.0, 2.0][r], comm_ms=0.5), (3.0, 1.0),
                    run_id="r0")
    slow = recorded(steps_frame(64, lambda r, s: [6.0, 2.0][r], comm_ms=2.0), (3.0, 1.0),
                    run_id="r1")
    classes, names, comm = classes_of(fast, slow)
    mix = deviceclass.resolve_mix([("rank0", 1), ("rank1", 1)], classes, names)[0]
    exchange = []
    for seed in (0, 1):  # simulated repeat r keeps to recorded repeat r
        sim = simulate.simulate(mix, comm, simulate.Scheme("bsp"), 64, 64, seed=seed)
        exchange.append(float(np.median(sim.reduced - sim.ready.max(axis=1, keepdims=True))))
    assert exchange[0] == pytest.approx(0.5 * MS, rel=0.05)
    assert exchange[1] == pytest.approx(2.0 * MS, rel=0.05)


def test_a_profile_round_trip_simulates_the_same_steps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(5)
    noise = rng.lognormal(0, 0.2, size=(40, 2))
    run = recorded(steps_frame(40, lambda r, s: [6.0, 2.0][r] * noise[s, r]),
                   slowdowns=(3.0, 1.0))
    classes, names, comm = classes_of(run)
    fitted = classes[names["cpu-3x"]]
    data = deviceclass.profile_json(fitted, comm, "mlp-digits", {"description": "test"})
    import json

    loaded, loaded_comm = deviceclass.from_profile(json.loads(json.dumps(data)))
    assert data["name"] == "cpu-3x@mlp-digits"
    one = simulate.simulate([fitted] * 3, comm, simulate.Scheme("bsp"), 30, 96, seed=2)
    two = simulate.simulate([loaded] * 3, loaded_comm, simulate.Scheme("bsp"), 30, 96, seed=2)
    assert two.end == pytest.approx(one.end, rel=1e-4)


def test_the_shipped_profiles_load_and_say_where_they_came_from() -> None:
    profiles = deviceclass.named_profiles()
    assert profiles, "no named profiles shipped in analysis/models/profiles"
    for name, data in profiles.items():
        cls, comm = deviceclass.from_profile(data)
        assert cls.line.b_ns > 0 and comm.bytes > 0, name
        assert data["origin"]["runs"] and data["origin"]["description"], name


def test_the_server_serves_one_push_at_a_time_first_come_first_served() -> None:
    done = simulate.serve(np.array([2.0, 0.0, 0.0, 10.0]), np.ones(4))
    assert done.tolist() == [3.0, 1.0, 2.0, 11.0]
    assert simulate.serve(np.zeros(3), np.ones(3), free=5.0).tolist() == [6.0, 7.0, 8.0]


def served_one_push_at_a_time(lead: np.ndarray, service: np.ndarray, size: np.ndarray,
                              target: float) -> np.ndarray:
    """The reference: a heap of each worker's next arrival, one push served at a time."""
    import heapq

    rows, n = lead.shape
    served = np.full((rows, n), np.nan)
    heap = [(lead[0, i], i, 0) for i in range(n)]
    heapq.heapify(heap)
    free, samples = -np.inf, 0.0
    while heap:
        arrival, i, k = heapq.heappop(heap)
        free = max(arrival, free) + service[k, i]
        served[k, i] = free
        samples += size[k, i]
        if samples >= target:
            break
        if k + 1 < rows:
            heapq.heappush(heap, (free + lead[k + 1, i], i, k + 1))
    return served


@pytest.mark.parametrize(("workers", "spread", "busy"), [
    (1, 1.0, 0.1), (3, 1.5, 0.1), (16, 4.0, 0.1), (16, 1.2, 3.0), (64, 10.0, 0.5)])
def test_pushes_served_in_batches_are_served_as_one_at_a_time(workers: int, spread: float,
                                                              busy: float) -> None:
    """ps-async's event loop in batches equals a heap served one push at a time: workers
    of unequal speed (`spread`), a server idle or the bottleneck (`busy`), a run ended by
    its samples (mid-batch) or by its rows, ties in arrival among them."""
    rng = np.random.default_rng(workers)
    rows = 40
    speed = rng.uniform(1.0, spread, workers)
    lead = speed * rng.uniform(0.8, 1.2, (rows, workers))
    lead[0, : workers // 2] = lead[0, 0]  # ties at the first arrivals: the lower worker first
    service = busy / workers * rng.uniform(0.5, 1.5, (rows, workers))
    size = rng.integers(1, 5, (rows, workers)).astype(float)
    for target in (size.sum() * 0.6, np.inf):
        got, order = simulate.serve_pushes(lead, service, size, target)
        want = served_one_push_at_a_time(lead, service, size, target)
        assert np.all(np.diff(got.ravel()[order]) >= 0)  # served in that order
        assert sorted(order) == np.flatnonzero(~np.isnan(got)).tolist()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-12)
        if target == np.inf:
            assert not np.isnan(got).any()  # every row of every worker
        else:
            assert size[~np.isnan(got)].sum() >= target > size[~np.isnan(got)].sum() - size.max()


def test_at_scale_the_servers_set_the_pace_of_the_asynchronous_scheme() -> None:
    run = steady_pair()
    _, _, comm = classes_of(run)
    many = workers("rank1:64", [run])  # 64 workers of 2 ms per 32 samples
    one = simulate.summarise(simulate.simulate(many, comm, simulate.Scheme("ps-async"), 30,
                                               32 * 64))
    # one server applies a push in the fitted time after the all-reduce (0.1 ms,
    # tests/synthetic.py): at most 32 samples per update; the transfers go side by side
    cap = 32 / (MS / 10) * 1e9
    assert one["samples_per_s"] <= cap * 1.01
    assert one["samples_per_s"] >= cap * 0.9  # 64 workers keep it busy
    assert one["idle_fraction"] > 0.2  # they queue there (alone they would not wait at all)
    four = simulate.summarise(simulate.simulate(many, comm, simulate.Scheme("ps-async"), 30,
                                                32 * 64, servers=4))
    # four servers (each a quarter of the update) leave the workers' own pace to set it
    assert four["samples_per_s"] > 1.5 * one["samples_per_s"]
    assert four["idle_fraction"] < one["idle_fraction"] / 2


def pair_with_a_short_apply(slowdowns: tuple[float, float] = (1.0, 1.0)
                            ) -> tuple[list[Any], CommModel]:
    """The steady pair (6 and 2 ms, each emulating its `slowdowns`) recorded under BSP
    with 0.1 ms after the exchange, of which 0.03 ms the apply phase (the optimizer's
    update the rest): its two classes and its fitted exchange."""
    def short_apply(rows: np.ndarray) -> None:
        rows["apply_ns"] = 30_000
        rows["unpack_ns"] = MS // 10 - 30_000

    meta, frame = recorded(steps_frame(64, lambda r, s: [6.0, 2.0][r], edit=short_apply),
                           slowdowns=slowdowns)
    classes, names, comm = classes_of((meta, frame))
    return [classes[names["rank0"]], classes[names["rank1"]]], comm


def test_ps_sync_waits_for_every_push_and_the_busiest_server_sets_the_transfers() -> None:
    """ps-sync: each step's version is made once both pushes are served, and both workers
    start the next step from it. Its transfers (50 us of latency and 1 ms for the whole
    gradient, each way) are the worker's, whatever the servers; the update (0.1 ms: the
    recorded time after the exchange) is the busiest server's share of it: all on one
    server, half each on two, 90% on the busier of two when the placement deals it the
    large tensors."""
    pair, comm = pair_with_a_short_apply()
    link = CommModel(50_000.0, MS / comm.bytes, comm.bytes, "")
    for servers, busiest, share in ((1, None, 1.0), (2, None, 0.5), (2, 0.9, 0.9)):
        sim = simulate.simulate(pair, link, simulate.Scheme("ps-sync"), 30, 64,
                                servers=servers, busiest=busiest)
        assert not sim.asynchronous.any() and not sim.dropped.any()
        # the slow worker's compute, its push up, its service (the fast one's was served
        # while it computed), the reply back, the worker's apply, 10 us to the next step
        one_way = 0.05 + 1.0
        period = (6.0 + one_way + 0.1 * share + one_way + 0.03 + 0.01) * MS
        for worker in (0, 1):
            assert np.median(np.diff(sim.begin[:20, worker])) == pytest.approx(period)
        assert (sim.reduced[:, 0] == sim.reduced[:, 1]).all()  # one reply for both
        summary = simulate.summarise(sim)
        assert summary["mean_step_ms"] * MS == pytest.approx(period, rel=0.01)
        assert summary["idle_fraction"] == pytest.approx(4.0 / (period / MS) / 2, rel=0.05)


def test_fc_on_server_computes_the_tail_on_a_server_inside_the_stretched_forward() -> None:
    """Worker 0 emulates a device 3x slower (6 ms a step, 2 ms of it real), worker 1 takes
    2 ms. A quarter of the forward + backward is the tail, which the server computes at the
    unslowed line (0.5 ms a slice, each worker's in turn); a quarter is the layers' forward
    before it, a half their backward. The activations take 0.15 ms each way; the other
    half of the parameters 0.55 ms each way to the other server, which updates them in
    0.05 ms (half of the recorded 0.1 ms)."""
    pair, comm = pair_with_a_short_apply(slowdowns=(3.0, 1.0))
    link = CommModel(50_000.0, MS / comm.bytes, comm.bytes, "")
    tail = simulate.Tail(0.25, 0.5, comm.bytes / 32 / 10, 0.5)
    sim = simulate.simulate(pair, link, simulate.Scheme("ps-sync"), 20, 64, servers=2,
                            tail=tail)
    assert sim.begin.shape == (20, 2) and not sim.asynchronous.any()
    # both reach the tail at 0.5 + 0.15 ms, worker 0 first (the lower rank): served until
    # 1.15, worker 1 until 1.65; back 0.15 ms later
    step = sim.begin[5]
    ready = sim.ready[5] - step
    # worker 0's forward phase (1.30 ms) stretched 3x, then its backward (3 ms); worker 1's
    # (1.80 ms) unstretched, then 1 ms
    assert ready / MS == pytest.approx([3 * 1.30 + 3.0, 1.80 + 1.0])
    # worker 0 pushes last: 0.55 ms up, 0.05 ms served, 0.55 back, its apply, 10 us
    period = (3 * 1.30 + 3.0 + 0.55 + 0.05 + 0.55 + 0.03 + 0.01) * MS
    assert np.diff(sim.begin[2:10, 0]) == pytest.approx(np.full(7, period))
    with pytest.raises(ValueError, match="needs ps-sync on 2 servers"):
        simulate.simulate(pair, link, simulate.Scheme("ps-sync"), 20, 64, tail=tail)


def test_every_simulated_scheme_is_named_in_the_registries() -> None:
    """The simulator's schemes are a real run's aggregator, policy and option: a simulated
    run's manifest names them, and recorded runs map back to them (deviceclass)."""
    from hetbench.analysis.models.simulated import SIMULATED
    from hetbench.harness.partition.policies import POLICIES
    from hetbench.harness.spec.aggregators import AGGREGATORS

    for name, simulated in SIMULATED.items():
        assert simulated.aggregator in AGGREGATORS, name
        assert simulated.policy is None or simulated.policy in POLICIES, name
        assert simulated.key is None or simulated.key in AGGREGATORS[simulated.aggregator].keys
        assert bool(simulated.key) == bool(simulated.letter), name


def test_an_aggregator_the_registry_declares_is_simulated_and_analysed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An aggregator that behaves as one the simulator models needs its exchange module and
    its registry entry, no more: from its Kind alone a recorded run of it is reproduced by
    the simulator's model, the network analysis counts a ring's bytes for it, and the
    statistical model reads its averaging period."""
    from hetbench.analysis.measures.network import bytes_per_step
    from hetbench.analysis.models import simulated
    from hetbench.analysis.tables.statistical import period
    from hetbench.harness.spec.aggregators import AGGREGATORS, Kind, Simulation

    monkeypatch.setitem(AGGREGATORS, "my-async", Kind(
        "my.exchange:MyAsync", lockstep=False, staleness_bound="unbounded",
        simulation=Simulation("ps-async")))
    monkeypatch.setitem(AGGREGATORS, "my-average", Kind(
        "my.exchange:MyAverage", keys=("local_steps",), staleness_bound="local_steps",
        moves="parameters", allreduces_buffer=True,
        simulation=Simulation("local-sgd", option="local_steps", letter="H")))
    monkeypatch.setitem(AGGREGATORS, "my-allreduce", Kind("my.exchange:MyAllreduce"))
    averaged = {"run": {"aggregator": {"name": "my-average", "local_steps": 4}},
                "workers": [{"parameters": 99}, {"parameters": 99}]}
    assert simulated.recorded({"aggregator": {"name": "my-async"}}) == "ps-async"
    assert simulated.recorded(averaged["run"]) == "local-sgd"
    # not simulated, lockstep: as BSP's all-reduce under the run's partition policy
    assert simulated.recorded({"aggregator": {"name": "my-allreduce"},
                               "partition": {"policy": "profiled"}}) == "bsp-profiled"
    assert period(averaged) == 4
    # a ring of 2: 2 (2 - 1) / 2 of 4 bytes x (99 parameters + the loss)
    assert bytes_per_step(averaged, 2) == {0: 400.0, 1: 400.0}
    assert np.isnan(bytes_per_step({**averaged, "run": {"aggregator": {"name": "my-async"}}},
                                   2)[0])


def evaluated_pair(pause_ms: float = 20.0) -> tuple[dict[str, Any], pd.DataFrame]:
    """The steady pair (6 and 2 ms) with a held-out evaluation of `pause_ms` after every
    tenth step (eval_every = 10), which both workers wait for, as a lockstep run does."""
    def pause(rows: np.ndarray) -> None:
        shift = (rows["step"] // 10) * int(pause_ms * MS)
        for field in ("begin_ns", "ready_ns", "reduced_ns", "end_ns"):
            rows[field] += shift

    meta, frame = recorded(steps_frame(60, lambda r, s: [6.0, 2.0][r], edit=pause))
    meta["run"]["eval_every"] = 10
    return meta, frame


def test_the_evaluations_are_kept_apart_from_the_loop_gap() -> None:
    classes, _, _ = classes_of(evaluated_pair())
    for cls in classes.values():
        source = cls.sources[0]
        after = np.flatnonzero(source.evaluations() > 0)
        assert list(after) == [9, 19, 29, 39, 49]  # step s where s + 1 is a multiple of 10
        assert source.evaluations()[after] == pytest.approx(20 * MS, rel=1e-6)
        assert source.gap_ns == pytest.approx(MS // 100, abs=1)  # the loop's own 10 us


def test_a_lockstep_scheme_waits_for_each_evaluation_and_ps_async_only_worker_0() -> None:
    """BSP: every worker pauses alike; ps-async: worker 0 alone (the others go on). The
    training clock leaves worker 0's pauses out of the wall time."""
    classes, names, comm = classes_of(evaluated_pair())
    pair = [classes[names["rank0"]], classes[names["rank1"]]]
    bsp = simulate.simulate(pair, comm, simulate.Scheme("bsp"), 200, 64)
    assert (bsp.evaluation[:, 0] > 0).sum() >= 5
    assert np.array_equal(bsp.evaluation[:, 0], bsp.evaluation[:, 1])
    free = simulate.simulate(pair, comm, simulate.Scheme("ps-async"), 200, 64)
    kept = free.kept
    assert (free.evaluation[kept[:, 0], 0] > 0).any()
    assert not free.evaluation[:, 1].any()
    fast = np.flatnonzero(kept[:, 1])
    assert (free.begin[fast[1:], 1] - free.end[fast[:-1], 1]).max() < MS  # never paused
    for sim in (bsp, free):
        s = simulate.summarise(sim)
        wall = sim.end[sim.kept].max() - sim.begin[sim.kept].min()
        paused = sim.evaluation[np.flatnonzero(sim.kept[:, 0])[:-1], 0].sum()
        assert paused > 0 and s["train_fraction"] == pytest.approx(1 - paused / wall)


def test_under_a_parameter_server_the_server_makes_the_update_and_the_worker_loads_it() -> None:
    """Recorded under BSP: 0.1 ms after the exchange, of which 0.03 ms the apply phase (the
    optimizer's update the rest). Under ps-async the server applies each push for the whole
    0.1 ms, one at a time, and the worker spends only its apply phase after its exchange;
    the transfers (no time here but 50 us each way) go side by side."""
    pair, comm = pair_with_a_short_apply()
    instant = CommModel(50_000.0, 0.0, comm.bytes, "")
    free = simulate.simulate(pair, instant, simulate.Scheme("ps-async"), 40, 64)
    assert np.median(free.end - free.reduced) == pytest.approx(30_000)  # the worker's part
    assert np.median(free.pull - free.push) == pytest.approx(MS / 10)  # the server's
    # compute, 50 us up, the update, 50 us back, the worker's apply, 10 us to the next step
    assert np.median(np.diff(free.begin[:20, 1])) == pytest.approx(2.24 * MS)
    bsp = simulate.simulate(pair, instant, simulate.Scheme("bsp"), 40, 64)
    assert np.median(bsp.end - bsp.reduced) == pytest.approx(MS / 10)  # all of it, BSP
