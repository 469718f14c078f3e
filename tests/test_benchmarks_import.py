"""The benchmarks stay runnable: CI runs none of them (they measure, on a quiet machine),
so an API they use can change under them unseen (bench_adapter.py imported a function
that no longer existed for several sessions). Every script imports, and pytest collects
every pytest-benchmark module."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from tests.conftest import REPO, Spawn

SCRIPTS = sorted(p for p in (REPO / "benchmarks").glob("*.py")
                 if not p.name.startswith(("bench_", "conftest")))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_imports(path, monkeypatch) -> None:
    script(path.stem, monkeypatch)


def test_pytest_collects_every_benchmark_module(spawn: Spawn) -> None:
    done = spawn.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                      "-p", "no:cacheprovider", "benchmarks/"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " tests collected" in done.stdout or "tests collected" in done.stdout


def script(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """benchmarks/<name>.py, imported (its main() not called)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # scripts import their neighbours
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}",
                                                  REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ci_check_against_ddp_fails_only_a_pair_slower_in_every_repeat(monkeypatch
                                                                           ) -> None:
    """`ddp_compare.py --fail-above R` (run by .ci/run): a hetbench variant whose step is
    1.3x its DDP counterpart's in every repeat fails at R = 1.2; one that is as fast as its
    counterpart, give or take the machine's noise, does not, even where it is slower than
    the other DDP variant (overlapped or not) beyond R."""
    module = script("ddp_compare", monkeypatch)
    ddp = [70.0, 72.0, 69.0, 75.0]
    overlap = [v * 1.3 for v in ddp]  # overlap paying badly: DDP's own 1.3x slower
    medians = {"hetbench": [v * 1.3 for v in ddp],
               "hetbench-ddp-overlap": [v * f for v, f in zip(overlap, (0.95, 1.08, 1.01, 0.97),
                                                              strict=True)],
               "ddp": ddp, "ddp-overlap": overlap}
    lines, slower = module.ratio_lines(medians, 1.2)
    assert len(lines) == 4 and lines[0].startswith("hetbench / ddp: ratio 1.300")
    assert [s.split(" (")[0] for s in slower] == ["hetbench / ddp"]
    medians["hetbench-ddp-overlap"] = [v * 1.25 for v in overlap]
    assert [s.split(" (")[0] for s in module.ratio_lines(medians, 1.2)[1]] == [
        "hetbench / ddp", "hetbench-ddp-overlap / ddp-overlap"]
    assert module.ratio_lines(medians, None)[1] == []


def test_a_variants_step_period_and_phases_come_from_its_workers_marks(monkeypatch) -> None:
    """`ddp_compare.py`'s measures from per-worker marks (begin, forward's end, gradients
    summed, update's end), numbers chosen by hand: the step is the latest end minus the
    earliest begin, the period the earliest begins' difference, each phase the median over
    workers and steps, `between` the time from a worker's end to its next begin; a run
    with instrument = false (NaN middle marks) has its step and period but no phases."""
    import math
    import tomllib

    import numpy as np

    from hetbench.harness.spec.suite import parse_suite

    module = script("ddp_compare", monkeypatch)
    # rank 0 and rank 1, three steps each; rank 1 begins 1 later and ends 2 later
    rank0 = [[0, 10, 40, 41], [50, 60, 90, 91], [100, 110, 140, 141]]
    rank1 = [[1, 12, 42, 43], [51, 63, 92, 93], [101, 112, 142, 143]]
    taken = module.taken_from_marks(np.array([rank0, rank1], dtype=float), {})
    assert taken.step_ns.tolist() == [43, 43, 43]
    assert taken.period_ns.tolist() == [50, 50]
    # forward 10,10,10,11,12,11; backward + exchange 30,30,30,30,29,30; update 1 x4, 1, 1;
    # between 50-41, 100-91, 51-43, 101-93
    assert taken.phases_ns == [10.5, 30.0, 1.0, 8.5]
    bare = np.array([rank0, rank1], dtype=float)
    bare[:, :, 1:3] = np.nan
    untimed = module.taken_from_marks(bare, {})
    assert untimed.step_ns.tolist() == [43, 43, 43] and untimed.phases_ns[3] == 8.5
    assert all(math.isnan(v) for v in untimed.phases_ns[:3])
    table = module.phase_table({"hetbench-bare": [untimed.phases_ns]})
    assert table[1].split() == ["hetbench-bare", "-", "-", "-", "0.00"]
    # the suite torchrun's variant reads, written as TOML: pinned workers, the ddp aggregator
    suite = {"suite": {"name": "ddp-compare"},
             "runs": [{"name": "hetbench", "steps": 5, "instrument": True,
                       "workers": [{"device": "cpu", "cores": [0]},
                                   {"device": "cpu", "cores": [1]}],
                       "aggregator": {"name": "ddp", "bucket_mb": 0.03}}]}
    written = tomllib.loads(module._toml(suite))
    assert written["runs"] == suite["runs"]
    assert parse_suite(written).runs[0].aggregator.bucket_mb == 0.03


def test_the_simulators_errors_are_the_median_and_p90_of_their_sizes(monkeypatch) -> None:
    """`simulate_check.py`'s summary of a validation, on a table whose truth is known:
    replay over the fitted rows, estimation over the others, each error's size (absolute,
    in % or points), its median and its p90 (linear between the sorted sizes)."""
    import pandas as pd

    module = script("simulate_check", monkeypatch)
    table = pd.DataFrame({
        "run": ["pair", "trio", "quad", "six", "quad-abrupt"],
        "fitted": [True, False, False, False, False],
        "step_error": [0.02, -0.10, 0.04, 0.01, -0.02],
        "idle_error_points": [-0.5, 3.0, -1.0, 2.0, 0.0],
        "p99_error": [0.0, 0.2, -0.1, 0.0, 0.1],
        "slowdown": [1.0, 1.0, 1.0, 1.0, 2.5], "predicted_slowdown": [1.0] * 4 + [2.25]})
    lines = module.error_lines(table)
    # estimation sizes: step 1, 2, 4, 10 % (median 3.0, p90 10 - 0.3 x 6 = 8.2); idle 0, 1,
    # 2, 3 points (median 1.5, p90 2.7); p99 0, 10, 10, 20 % (median 10.0, p90 17.0)
    assert lines == [
        "replay error over 1 configuration(s): step 2.0% median, 2.0% p90; idle 0.5 points "
        "median, 0.5 points p90; p99 0.0% median, 0.0% p90",
        "estimation error over 4 configuration(s): step 3.0% median, 8.2% p90; idle 1.5 "
        "points median, 2.7 points p90; p99 10.0% median, 17.0% p90",
        "injected straggler, quad-abrupt: slowdown 2.50 measured, 2.25 simulated"]


def test_the_sync_ranking_check_compares_orders_and_errors(monkeypatch) -> None:
    """`sync_rank_check.py`'s comparison on rankings whose truth is known: a prediction in
    the measured order but half as fast everywhere has tau 1 and -50% errors; one scheme
    swapped with its neighbour costs one discordant pair of three, unless the two overlap
    in their repeats (then only the pairs the repeats order count, and agree)."""
    import pandas as pd

    module = script("sync_rank_check", monkeypatch)
    real = pd.DataFrame({"samples_per_s": [100.0, 200.0, 300.0],
                         "samples_per_s_low": [90.0, 190.0, 280.0],
                         "samples_per_s_high": [110.0, 210.0, 320.0],
                         "time_to_target_s": [3.0, 2.0, 1.0],
                         "time_to_target_s_low": [2.9, 1.5, 0.8],
                         "time_to_target_s_high": [3.1, 2.5, 1.6]}, index=["a", "b", "c"])
    model = pd.DataFrame({"samples_per_s": [50.0, 100.0, 150.0],
                          "time_to_target_s": [3.0, 1.0, 2.0]}, index=["a", "b", "c"])
    table, taus = module.compare(real, model)
    assert taus["samples_per_s"] == pytest.approx((1.0, 1.0, 3))
    # (2 concordant - 1) / 3 over all; b and c overlap: 2 ordered pairs, both agree
    assert taus["time_to_target_s"] == pytest.approx((1 / 3, 1.0, 2))
    assert table["samples_per_s_error"].tolist() == pytest.approx([-0.5] * 3)
    assert table.loc["b", "time_to_target_s_error"] == pytest.approx(-0.5)
