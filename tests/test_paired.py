"""The regression gate's paired statistics (analysis/tables/paired.py) and `hetbench compare
--paired`, on generated run directories whose rounds share a machine load that comes and
goes: each round's load stretches both sides' wall times by waits for a CPU (recorded as
compute_wait_ns, as schedstat counts them) and leaves their CPU time alone. No worker is
started."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t, ttest_1samp

from hetbench.analysis.tables import paired
from hetbench.analysis.tables.paired import (
    PairedSettings,
    compare_paired,
    interval,
    pair_runs,
    rounds_needed,
    row_verdict,
)
from hetbench.harness.cli.main import main
from hetbench.harness.records import collector, manifest
from hetbench.harness.records.collector import RECORD_FIELDS
from hetbench.harness.records.results import Run, load_run

RUN = {"name": "pair", "framework": "pytorch", "workload": "mlp", "steps": 30,
       "warmup_steps": 3, "global_batch": 64,
       "workers": [{"device": "cpu", "threads": 1}, {"device": "cpu", "threads": 1}]}
ENVIRONMENT = {"host": "ci-1", "cpu_model": "Generic CPU", "cpu_count": 2, "python": "3.11"}
COMPUTE_MS, COMM_MS = 2.0, 0.5


def steps_of(rng: np.random.Generator, load: float, cpu_factor: tuple[float, float] = (1, 1),
             cpu_noise: float = 0.01, sleep_ms: float = 0.0, counted: bool = True,
             steps: int = 30) -> pd.DataFrame:
    """One launch: each worker's compute is its CPU time (per-launch noise `cpu_noise`,
    scaled by `cpu_factor`) plus, in a step the load hits (probability `load`), a wait for a
    CPU of 1-3x the compute; `sleep_ms` blocks the compute without a wait (a sleep)."""
    launch = rng.lognormal(0.0, cpu_noise, 2)
    rows: list[dict[str, Any]] = []
    begin = 0
    for s in range(steps):
        cpu = [COMPUTE_MS * 1e6 * cpu_factor[w] * launch[w] * rng.lognormal(0, 0.02)
               for w in range(2)]
        wait = [c * rng.uniform(1, 3) if rng.random() < load else 0.0 for c in cpu]
        wall = [int(c + x + sleep_ms * 1e6) for c, x in zip(cpu, wait, strict=True)]
        arrival = begin + max(wall)
        comm = int(COMM_MS * 1e6 * (1 + 2 * load * rng.random()))
        for w in range(2):
            row = dict.fromkeys(RECORD_FIELDS, 0)
            row.update(rank=w, step=s, batch_size=32, slice_start=32 * w, begin_ns=begin,
                       ready_ns=begin + wall[w], reduced_ns=arrival + comm,
                       end_ns=arrival + comm, forward_ns=wall[w] // 2,
                       backward_ns=wall[w] // 2, allreduce_ns=arrival + comm - begin - wall[w],
                       compute_cpu_ns=int(cpu[w]) if counted else -1,
                       compute_wait_ns=int(wait[w]) if counted else -1, loss=1.0)
            rows.append(row)
        begin = arrival + comm
    return pd.DataFrame(rows, columns=list(RECORD_FIELDS))


def write_run(folder: Path, round_: int, side: int, steps: pd.DataFrame) -> Path:
    run_dir = folder / "gen" / f"pair-{round_}"
    run_dir.mkdir(parents=True)
    meta = manifest.new({"name": "gen", "repeats": 1}, RUN, 0, f"pair-{round_}-{side}",
                        ENVIRONMENT, "homogeneous")
    meta["status"] = "completed"
    # the rounds' order: A B B A ..., a minute a launch
    order = 2 * round_ + (side if round_ % 2 == 0 else 1 - side)
    meta["start"] = f"2026-12-02T05:{order:02d}:00.000+00:00"
    manifest.write(run_dir, meta)
    collector.write_steps(run_dir, steps)
    return run_dir


def gate_rounds(tmp_path: Path, rounds: int, seed: int, current: dict[str, Any] | None = None,
                base: dict[str, Any] | None = None, loads: list[float] | None = None
                ) -> tuple[list[Run], list[Run]]:
    """`rounds` rounds of a base and a current launch; each round's load (by default one
    that comes and goes: 0.0 to 0.9 of the steps delayed) hits both of its launches."""
    rng = np.random.default_rng(seed)
    loads = loads or [float(x) for x in rng.choice([0.0, 0.1, 0.5, 0.9], rounds)]
    for i in range(rounds):
        write_run(tmp_path / "base", i, 0, steps_of(rng, loads[i], **(base or {})))
        write_run(tmp_path / "current", i, 1, steps_of(rng, loads[i], **(current or {})))
    return ([load_run(d) for d in sorted((tmp_path / "base" / "gen").iterdir())],
            [load_run(d) for d in sorted((tmp_path / "current" / "gen").iterdir())])


def rows(comparison: paired.PairedComparison, metric: str) -> pd.DataFrame:
    return comparison.table[comparison.table["metric"] == metric]


# -- the statistics -------------------------------------------------------------------------


def test_the_interval_is_students_on_the_log_ratios() -> None:
    d = np.log(np.array([1.02, 0.97, 1.05, 1.01, 0.99, 1.03]))
    mean, half, sd = interval(d, 0.99)
    reference = ttest_1samp(d, 0.0).confidence_interval(0.99)
    assert mean - half == pytest.approx(reference.low)
    assert mean + half == pytest.approx(reference.high)
    assert sd == pytest.approx(np.std(d, ddof=1))


@pytest.mark.parametrize(("mean", "half", "better", "verdict"), [
    (math.log(1.10), 0.02, "lower", "regressed"),
    (math.log(1.10), 0.02, "higher", "improved"),
    (math.log(1.10), 0.20, "lower", "inconclusive"),  # beyond, but the interval reaches 1
    (math.log(1.01), 0.02, "lower", "unchanged"),
    (math.log(1.03), 0.03, "lower", "inconclusive"),  # surely worse, maybe within 5%
])
def test_row_verdicts(mean: float, half: float, better: str, verdict: str) -> None:
    assert row_verdict(mean, half, 8, better, 0.05)[0] == verdict


def test_too_few_pairs_claim_nothing() -> None:
    assert row_verdict(0.0, 0.0, 2, "lower", 0.05) == ("inconclusive", "fewer than 3 pairs")


def test_rounds_needed_shrinks_with_the_spread_and_meets_the_claim() -> None:
    level = 1 - 0.05 / 4
    wide = rounds_needed(0.01, 0.06, 5, 0.05, level)
    narrow = rounds_needed(0.01, 0.02, 5, 0.05, level)
    assert wide is not None and narrow is not None and narrow < wide
    # the planned count is the first at which Student's half-width fits the margin left
    # inside the band (log 1.05 - 0.01)
    margin = math.log1p(0.05) - 0.01
    half = [t.ppf(0.5 + level / 2, n - 1) * 0.06 / math.sqrt(n) for n in (wide - 1, wide)]
    assert half[0] >= margin > half[1]
    # beyond the threshold the claim is clear of 1: the margin is the estimate itself
    assert rounds_needed(math.log(1.3), 0.06, 5, 0.05, level) == 5
    assert rounds_needed(0.0, 0.5, 5, 0.05, level) is None  # more than any plan


# -- gates on generated rounds --------------------------------------------------------------


def test_unchanged_code_is_confirmed_under_a_load_that_comes_and_goes(tmp_path: Path) -> None:
    base, current = gate_rounds(tmp_path, 8, seed=1)
    comparison = compare_paired(base, current)
    assert comparison.verdict == "unchanged", comparison.table
    assert comparison.exit_status == 0
    gate = comparison.table[comparison.table["role"] == "gate"]
    assert set(gate["metric"]) == {"cpu_per_sample_us", "compute_busy_ms"}
    assert len(gate) == 4 and (gate["verdict"] == "unchanged").all()
    # the wall clock moved with the load; the counted delayed steps say how much of it
    assert 0.1 < comparison.delayed["base"] < 0.9


def test_a_ten_percent_compute_regression_is_flagged_where_it_is(tmp_path: Path) -> None:
    base, current = gate_rounds(tmp_path, 8, seed=2, current={"cpu_factor": (1.0, 1.1)})
    comparison = compare_paired(base, current)
    assert comparison.verdict == "regressed"
    assert comparison.exit_status == 1
    cpu = rows(comparison, "cpu_per_sample_us").set_index("worker")
    assert cpu.loc[1, "verdict"] == "regressed" and cpu.loc[0, "verdict"] == "unchanged"
    assert cpu.loc[1, "ratio"] == pytest.approx(1.1, abs=0.03)
    assert comparison.moved()[0].startswith("pair worker 1: cpu_per_sample_us +")


def test_a_sleep_the_cpu_time_cannot_see_is_caught_by_the_compute_less_wait(
        tmp_path: Path) -> None:
    base, current = gate_rounds(tmp_path, 8, seed=3, current={"sleep_ms": 0.6})
    comparison = compare_paired(base, current)
    assert comparison.verdict == "regressed"
    busy = rows(comparison, "compute_busy_ms").set_index("worker")
    assert (busy["verdict"] == "regressed").all()
    assert (rows(comparison, "cpu_per_sample_us")["verdict"] == "unchanged").all()


def test_noise_too_large_for_the_rounds_says_how_many_it_would_need(tmp_path: Path) -> None:
    base, current = gate_rounds(tmp_path, 5, seed=4, base={"cpu_noise": 0.08},
                                current={"cpu_noise": 0.08})
    comparison = compare_paired(base, current)
    assert comparison.verdict == "inconclusive"
    assert comparison.exit_status == 3
    assert comparison.rounds_needed is None or comparison.rounds_needed > 5


def test_pairs_are_the_rounds_and_a_run_without_its_partner_is_left_out(
        tmp_path: Path) -> None:
    base, current = gate_rounds(tmp_path, 5, seed=5)
    pairs, warnings = pair_runs(base[::-1], current)
    assert [(b.run_dir.name, c.run_dir.name) for b, c in pairs] == [
        (f"pair-{i}", f"pair-{i}") for i in range(5)] and warnings == []
    # round 2's current launch failed (left out): the rounds after it keep their partners
    pairs, warnings = pair_runs(base, current[:2] + current[3:])
    assert [(b.run_dir.name, c.run_dir.name) for b, c in pairs] == [
        (f"pair-{i}", f"pair-{i}") for i in (0, 1, 3, 4)]
    assert warnings == ["gen/pair: 5 BASE and 4 CURRENT runs: 4 pairs by start time, "
                        "1 run(s) without a partner left out"]


def test_a_base_without_counters_is_gated_on_the_wall_clock_with_a_warning(
        tmp_path: Path) -> None:
    base, current = gate_rounds(tmp_path, 6, seed=6, base={"counted": False},
                                loads=[0.0] * 6)
    comparison = compare_paired(base, current)
    assert any("no gate metric on both sides" in w for w in comparison.warnings)
    gate = comparison.table[comparison.table["role"] == "gate"]
    assert set(gate["metric"]) == {"step_time_ms", "samples_per_s"}


def test_a_narrower_threshold_for_one_metric(tmp_path: Path) -> None:
    base, current = gate_rounds(tmp_path, 8, seed=7, current={"cpu_factor": (1.0, 1.1)})
    settings = PairedSettings(metric_thresholds=(("cpu_per_sample_us", 0.2),))
    table = compare_paired(base, current, settings).table
    cpu = table[(table["metric"] == "cpu_per_sample_us") & (table["worker"] == 1)].iloc[0]
    assert cpu["threshold"] == 0.2 and cpu["verdict"] != "regressed"


# -- the command line -----------------------------------------------------------------------


def test_compare_paired_exits_0_on_unchanged_and_1_on_a_regression(tmp_path: Path,
                                                                     capsys) -> None:
    gate_rounds(tmp_path / "same", 8, seed=8)
    gate_rounds(tmp_path / "slow", 8, seed=9, current={"cpu_factor": (1.3, 1.3)})
    assert main(["compare", str(tmp_path / "same" / "base"), str(tmp_path / "same" / "current"),
                 "--paired"]) == 0
    assert capsys.readouterr().out.startswith("verdict: UNCHANGED after 8 round(s)")
    assert main(["compare", str(tmp_path / "slow" / "base"), str(tmp_path / "slow" / "current"),
                 "--paired", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "regressed" and result["paired"] is True
    assert result["rounds"] == 8
    assert any(m.startswith("pair worker 0: cpu_per_sample_us +") for m in result["moved"])


def test_compare_paired_bad_metric_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    gate_rounds(tmp_path, 3, seed=10)
    status = main(["compare", str(tmp_path / "base"), str(tmp_path / "current"), "--paired",
                   "--metrics", "no_such_metric"])
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--metrics" in err[0] and "no_such_metric" in err[0]
