"""`hetbench explain` (harness/cli/explain.py): which variant takes each straggler cause
away (analysis/advice/interventions.py), how removing it is measured against the share the
attribution gave it (analysis/advice/explain_report.py), and the command end to end."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.advice import explain_report, interventions
from hetbench.harness.records.results import load_run
from hetbench.harness.spec.suite import parse_suite
from hetbench.harness.spec.tables import run_table

TIMEOUT_S = 240.0


def spec(**run: Any) -> Any:
    return parse_suite({"runs": [{"name": "r", "workers": [{}, {}], **run}]}).runs[0]


def planned(run: Any, shares: dict[str, float], cores: tuple[int, ...] = (0, 1), top: int = 5
            ) -> dict[str, Any]:
    return {f"{item.cause}:{getattr(item, 'name', '')}": item
            for item in interventions.plan(run, shares, cores, top)}


def test_each_removable_cause_gets_the_variant_whose_keys_take_it_away() -> None:
    run = spec(keep_freed_memory=False, loader={"workers": 2},
               workers=[{"threads": 2}, {"loader_workers": 0,
                                         "jitter": {"probability": 0.2, "factor": 3.0}}])
    plan = planned(run, {"gc": 0.3, "page_faults": 0.2, "load": 0.15, "jitter": 0.1,
                         "blocked": 0.08, "preempted": 0.06}, cores=(0, 1, 2), top=6)
    assert plan["gc:gc-off"].run.gc == "off"
    assert plan["page_faults:keep-freed"].run.keep_freed_memory is True
    fed = plan["load:fed"].run
    assert [w.loader_workers for w in fed.workers] == [None, None] and fed.loader.workers == 2
    assert [w.jitter for w in plan["jitter:no-jitter"].run.workers] == [None, None]
    assert [w.threads for w in plan["blocked:one-thread"].run.workers] == [1, 1]
    # 2 + 1 threads on 3 CPUs: each worker on cores of its own
    assert [w.cores for w in plan["preempted:pinned"].run.workers] == [(0, 1), (2,)]
    assert [w.threads for w in plan["preempted:one-thread"].run.workers] == [1, 1]
    # each variant changes only what takes its cause away
    assert run_table(plan["gc:gc-off"].run) == {**run_table(run), "gc": "off"}


def test_a_cause_no_key_removes_is_said_so_and_small_causes_and_noise_are_left_out() -> None:
    run = spec()  # freed memory kept, one thread each, no loader, no jitter
    plan = planned(run, {"interference": 0.4, "noise": 0.3, "page_faults": 0.1,
                         "on_cpu": 0.1, "load": 0.06, "gc": 0.04}, cores=(0,))
    assert set(plan) == {"interference:", "page_faults:", "on_cpu:", "load:"}
    assert all(isinstance(p, interventions.Unremovable) for p in plan.values())
    assert "outside the run" in plan["interference:"].why
    assert "already keeps freed memory" in plan["page_faults:"].why
    three = interventions.plan(run, {"a": 0.5, "b": 0.3, "c": 0.2, "d": 0.1}, (0,), 3)
    assert [p.cause for p in three] == ["a", "b", "c"]


def test_more_loader_processes_where_no_worker_is_starved() -> None:
    plan = planned(spec(loader={"workers": 3}), {"load": 0.5})
    assert plan["load:more-loaders"].run.loader.workers == 6
    assert "load:" in planned(spec(), {"load": 0.5})  # loads in line: no loader key to set


def measures(share: float, step_ms: float = 10.0, excess: float = 100.0,
             cause_ms: dict[str, float] | None = None) -> dict[str, Any]:
    return {"step_ms": step_ms, "step_p99_p50": 2.0, "idle_fraction": 0.1,
            "cost_of_variability": 0.2, "lost": 0.1, "excess_per_step_ms": share,
            "excess_ms": excess, "cause_ms": cause_ms or {}}


def rows(per_run: dict[str, list[dict[str, Any]]]) -> pd.DataFrame:
    return pd.DataFrame([{"run": name, "repeat": i, "measures": m,
                          **{k: v for k, v in m.items() if not isinstance(v, dict)}}
                         for name, ms in per_run.items() for i, m in enumerate(ms)])


def test_the_measured_reduction_is_paired_by_repeat_and_set_against_the_share() -> None:
    """The recorded configuration's stragglers lose 20%, 40%, 30% of a median step in three
    repeats, 60% of it to gc; without gc they lose 8%, 16%, 12%: 60% less in each."""
    recorded = [measures(share, cause_ms={"gc": 60.0, "on_cpu": 40.0})
                for share in (0.2, 0.4, 0.3)]
    without = [measures(share * 0.4, step_ms=9.0) for share in (0.2, 0.4, 0.3)]
    variant = interventions.Intervention("gc", "gc-off", "off", spec(name="gc-off"))
    result = explain_report.compared(rows({"recorded": recorded, "gc-off": without}),
                                     [variant, interventions.Unremovable("on_cpu", "no")])
    r = result.set_index("intervention").loc["gc-off"]
    assert r["predicted"] == pytest.approx(0.6) and r["measured"] == pytest.approx(0.6)
    assert r["measured_low"] == pytest.approx(0.6) and r["step_ms_change"] == -1.0
    assert r["repeats"] == 3 and bool(r["agrees"]) and len(result) == 1
    # a reduction far from the share, measured tightly: disagrees; loosely: cannot say
    assert explain_report.agrees(0.6, 0.2, 0.15, 0.25) is False
    assert explain_report.agrees(0.6, 0.2, -0.5, 0.9) is None
    assert explain_report.agrees(0.6, 0.52, 0.45, 0.58) is True


def test_the_interval_is_students_over_the_repeats() -> None:
    mean, low, high = explain_report.interval(np.array([1.0, 2.0, 3.0]))
    # t(0.975, 2) = 4.303, sd 1, sqrt(3)
    assert (mean, low, high) == pytest.approx((2.0, 2.0 - 2.4843, 2.0 + 2.4843), abs=1e-3)
    assert math.isnan(explain_report.interval(np.array([1.0]))[1])


JITTERY = """
[suite]
name = "jit"
repeats = 1
[defaults]
workload = "mlp"
steps = 24
warmup_steps = 4
global_batch = 64
[[runs]]
name = "jittery"
workers = [ { device = "cpu" }, { device = "cpu", jitter = { probability = 0.3, factor = 6.0 } } ]
[[runs]]
name = "other"
workers = [ { device = "cpu" }, { device = "cpu" } ]
"""


def test_explain_runs_the_variant_beside_the_recorded_run_and_writes_its_verdict(
        tmp_path: Path, write_suite: Any, hetbench: Any) -> None:
    write_suite(JITTERY)
    recorded = hetbench(tmp_path, "run", "suite.toml", "--out", "rec", "--no-progress")
    assert recorded.returncode == 0, recorded.stderr
    # two configurations: name one
    both = hetbench(tmp_path, "explain", "rec", "--out", "x")
    assert both.returncode == 2 and both.stderr.count("\n") == 1, both.stderr
    assert "-k: 2 runs match (jittery, other): name one to explain" in both.stderr
    bad = hetbench(tmp_path, "explain", "rec", "-k", "jittery", "--top", "0", "--out", "x")
    assert bad.returncode == 2 and "--top: 0 is outside 1..10" in bad.stderr
    dry = hetbench(tmp_path, "explain", "rec", "-k", "jittery", "--dry-run", "--out", "x")
    assert dry.returncode == 0, dry.stderr
    assert "jitter (" in dry.stdout and "no-jitter: no worker's emulated jitter" in dry.stdout
    assert 'name = "no-jitter"' in dry.stdout and not (tmp_path / "x").exists()
    done = hetbench(tmp_path, "explain", "rec", "-k", "jittery", "--repeats", "1",
                    "--top", "1", "--steps", "20", "--no-figures", "--out", "x")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "x"
    result = pd.read_csv(out / "explain.csv")
    assert list(result["intervention"]) == ["no-jitter"] and result["repeats"].tolist() == [1]
    assert (out / "figures" / "explain.png").stat().st_size > 0
    text = (out / "explain.md").read_text()
    assert "| jitter | no-jitter: no worker's emulated jitter" in text
    assert "They agree within 10% or where the interval holds the prediction" in text
    runs = {load_run(d).name: load_run(d) for d in (out / "explained").glob("*-r0-*")}
    assert set(runs) == {"recorded", "no-jitter"}
    assert runs["recorded"].spec["workers"][1]["jitter"] == [0.3, 6.0]
    assert runs["no-jitter"].spec["workers"][1]["jitter"] is None
    assert runs["no-jitter"].spec["steps"] == 20
    # the recorded configuration's jittered steps were named jitter again
    shares = explain_report.pooled_shares([explain_report.run_measures(runs["recorded"])])
    assert shares["jitter"] == max(shares.values())


def test_explain_refuses_what_it_cannot_rerun(tmp_path: Path, hetbench: Any) -> None:
    missing = hetbench(tmp_path, "explain", "nowhere", "--out", "x")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert not (tmp_path / "x").exists()


def test_the_collector_is_off_or_frozen_over_the_steps_and_as_it_was_after() -> None:
    import gc

    from hetbench.harness.loop.collection import steps_collection

    assert gc.isenabled() and gc.get_freeze_count() == 0
    with steps_collection("off"):
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), steps_collection("frozen"):
        assert gc.get_freeze_count() > 0 and gc.isenabled()
        raise RuntimeError("a step failed")
    assert gc.get_freeze_count() == 0
    with steps_collection("auto"):
        assert gc.isenabled() and gc.get_freeze_count() == 0
