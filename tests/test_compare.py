"""`hetbench compare` and its statistics (analysis/tables/compare.py), on generated run directories:
no worker is started. Generated runs have a per-run speed factor (what a launch's fate
does) on top of per-step noise, like real ones."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu

from hetbench.analysis.tables import registry
from hetbench.analysis.tables.compare import (
    RUN_LEVEL,
    Settings,
    compare_paths,
    compare_values,
    holm,
    metric_values,
    min_pvalue,
    min_repeats,
    run_metrics,
)
from hetbench.harness.cli.main import main
from hetbench.harness.records import collector, manifest
from hetbench.harness.records.collector import RECORD_FIELDS
from hetbench.harness.records.results import load_run
from tests.conftest import REPO, Spawn, hetbench_command

ENVIRONMENT = {"host": "ci-1", "cpu_model": "Generic CPU @ 2.0GHz", "cpu_count": 2,
               "python": "3.11.9", "libraries": {"torch": "2.13.0", "numpy": "1.26.4"}}
RUN = {"name": "pair", "framework": "pytorch", "workload": "mlp", "steps": 40,
       "warmup_steps": 4, "global_batch": 64,
       "workers": [{"device": "cpu", "threads": 1}, {"device": "cpu", "threads": 1}]}
# Share of a worker's compute per phase before `ready`, and fixed costs after it (ms).
COMPUTE_SHARES = {"load": 0.03, "to_device": 0.02, "forward": 0.35, "backward": 0.55,
                  "pack": 0.05}
COMM_MS, UNPACK_MS, APPLY_MS = 0.5, 0.01, 0.1


def generate_steps(rng: np.random.Generator, factor: float = 1.0, workers: int = 2,
                   steps: int = 40, compute_ms: float = 1.0, step_noise: float = 0.05,
                   run_noise: float = 0.03) -> pd.DataFrame:
    """A steps table as the collector writes it; every duration scaled by `factor` and by
    one lognormal factor for the whole run."""
    scale = factor * float(rng.lognormal(0.0, run_noise))
    compute = compute_ms * 1e6 * scale * rng.lognormal(0.0, step_noise, (steps, workers))
    comm, unpack, apply = (int(x * 1e6 * scale) for x in (COMM_MS, UNPACK_MS, APPLY_MS))
    rows: list[dict[str, Any]] = []
    begin = 0
    for s in range(steps):
        ready = begin + compute[s].astype(np.int64)
        arrival = int(ready.max())
        for w in range(workers):
            row = dict.fromkeys(RECORD_FIELDS, 0)
            row.update(rank=w, step=s, batch_size=64 // workers, slice_start=w * 32,
                       begin_ns=begin, ready_ns=int(ready[w]), reduced_ns=arrival + comm,
                       end_ns=arrival + comm + unpack + apply, loss=1.0, local_loss=1.0)
            for phase, share in COMPUTE_SHARES.items():
                row[f"{phase}_ns"] = int(share * compute[s, w])
            row.update(allreduce_ns=arrival + comm - int(ready[w]), unpack_ns=unpack,
                       apply_ns=apply, compute_cpu_ns=int(compute[s, w]))  # never waited
            rows.append(row)
        begin = arrival + comm + unpack + apply
    return pd.DataFrame(rows, columns=list(RECORD_FIELDS))


def write_run(folder: Path, repeat: int, steps: pd.DataFrame, status: str = "completed",
              environment: dict[str, Any] | None = None, run: dict[str, Any] | None = None,
              suite: str = "gen") -> Path:
    run = run or RUN
    run_dir = folder / suite / f"{run['name']}-r{repeat}"
    run_dir.mkdir(parents=True)
    meta = manifest.new({"name": suite, "repeats": 1}, run, repeat, run_dir.name,
                        environment or ENVIRONMENT, "homogeneous")
    meta["status"] = status
    manifest.write(run_dir, meta)
    collector.write_steps(run_dir, steps)
    return run_dir


def write_group(folder: Path, repeats: int, seed: int, factor: float = 1.0,
                **kwargs: Any) -> Path:
    rng = np.random.default_rng(seed)
    for r in range(repeats):
        write_run(folder, r, generate_steps(rng, factor, **{
            k: v for k, v in kwargs.items() if k in ("step_noise", "run_noise")}),
            **{k: v for k, v in kwargs.items() if k in ("environment", "run")})
    return folder


def values(repeats: int, seed: int, factor: float = 1.0, **kwargs: Any) -> pd.DataFrame:
    """Per-run metric values of a generated group, without touching the disk."""
    rng = np.random.default_rng(seed)
    parts = []
    for r in range(repeats):
        v = run_metrics(generate_steps(rng, factor, **kwargs), RUN["warmup_steps"])
        v.insert(0, "run_id", f"r{r}")
        v.insert(0, "repeat", r)
        v.insert(0, "run", "pair")
        v.insert(0, "suite", "gen")
        parts.append(v)
    return pd.concat(parts, ignore_index=True)


def row(table: pd.DataFrame, metric: str, worker: int = RUN_LEVEL) -> pd.Series:
    match = table[(table["metric"] == metric) & (table["worker"] == worker)]
    assert len(match) == 1, table
    return match.iloc[0]


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run folders shared by the CLI tests: 10 repeats per side unless named otherwise."""
    root = tmp_path_factory.mktemp("groups")
    return {
        "base": write_group(root / "base", 10, seed=1),
        "slow": write_group(root / "slow", 10, seed=2, factor=1.3),
        "few_base": write_group(root / "few_base", 3, seed=3),
        "few_slow": write_group(root / "few_slow", 3, seed=4, factor=1.3),
    }


# -- statistics -----------------------------------------------------------------------------


def test_min_pvalue_is_the_exact_test_at_complete_separation() -> None:
    for n_base, n_current in [(3, 3), (5, 7), (9, 9)]:
        base, current = np.arange(n_base), np.arange(n_current) + 100.0
        exact = mannwhitneyu(current, base, alternative="two-sided", method="exact").pvalue
        assert min_pvalue(n_base, n_current) == pytest.approx(exact)


def test_min_repeats_per_side_for_the_default_alpha() -> None:
    # 2 / C(12, 6) = 0.0022 misses 0.002 by a hair: one metric needs 7 runs per side.
    assert min_repeats(0.002, 1) == 7
    assert min_repeats(0.002, 3) == 7 and min_repeats(0.002, 4) == 8
    assert min_repeats(0.002, 30) == 9  # a two-worker run: 10 run + 2 x 10 worker metrics
    assert min_repeats(0.002, 49) == 10
    assert min_repeats(0.05, 1) == 4


def test_holm_matches_the_step_down_procedure() -> None:
    adjusted = holm([0.01, 0.04, 0.03, 0.005, float("nan")])
    # sorted: 0.005*5, 0.01*4, 0.03*3, 0.04*2, nan(1)*1, made monotone and capped at 1
    assert adjusted.tolist() == pytest.approx([0.04, 0.09, 0.09, 0.025, 1.0])


def test_run_metrics_one_value_per_run_and_worker() -> None:
    steps = generate_steps(np.random.default_rng(0), run_noise=0.0, step_noise=0.0)
    v = run_metrics(steps, warmup_steps=4)
    # every compared run-level metric of the registry but the efficiency, which needs the
    # manifest's standalone rates
    assert set(v[v["worker"] == RUN_LEVEL]["metric"]) == {
        "step_time_ms", "mean_step_ms", "samples_per_s", "idle_fraction",
        "oracle_efficiency", "compute_cv_max", "residual_cv_max", "compute_p99_p50_max",
        "comm_p50_ms", "comm_p95_ms"}
    assert (v.groupby(["worker", "metric"]).size() == 1).all()
    assert set(v[v["worker"] == 0]["metric"]) == {
        "compute_ms", "cpu_per_sample_us", "compute_busy_ms", "compute_cv", *(
            f"phase_{p.value}_ms" for p in collector.PHASES)}
    step_ms = v[v["metric"] == "step_time_ms"]["value"].item()
    assert step_ms == pytest.approx(1.0 + COMM_MS + UNPACK_MS + APPLY_MS, rel=1e-6)
    assert v[v["metric"] == "idle_fraction"]["value"].item() == pytest.approx(0.0, abs=1e-6)


def test_only_the_selected_metrics_are_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetbench.analysis.measures import costmodel

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the oracle was computed for a comparison that does not use it")

    monkeypatch.setattr(registry, "oracle", refuse)
    monkeypatch.setattr(costmodel, "oracle", refuse)
    steps = generate_steps(np.random.default_rng(0))
    v = run_metrics(steps, 4, selects=lambda name: name in ("step_time_ms", "compute_ms"))
    assert set(v["metric"]) == {"step_time_ms", "compute_ms"}
    assert sorted(v["worker"]) == [RUN_LEVEL, 0, 1]
    with pytest.raises(AssertionError, match="the oracle was computed"):
        run_metrics(steps, 4)


def test_one_worker_has_no_idle_fraction() -> None:
    steps = generate_steps(np.random.default_rng(0), workers=1)
    assert "idle_fraction" not in set(run_metrics(steps)["metric"])


def test_identical_groups_are_never_regressed() -> None:
    """Nor unchanged where the interval is too wide to show it: an equivalence claim."""
    same = values(10, seed=5)
    table = compare_values(same, same)
    assert (table["ratio"] == 1.0).all()
    assert set(table["verdict"]) <= {"unchanged", "inconclusive"}
    inside = (table["ci_low"] >= 1 / 1.1) & (table["ci_high"] <= 1.1)
    assert ((table["verdict"] == "unchanged") == inside).all()
    assert inside.any() and not inside.all()  # steadier metrics shown, noisy ones not


@pytest.fixture(scope="module")
def pool() -> pd.DataFrame:
    """60 runs of one condition: any two disjoint sets of them are an A/A comparison."""
    return values(60, seed=100)


@pytest.mark.parametrize("draw", range(12))
def test_a_a_comparisons_raise_no_alarm(pool: pd.DataFrame, draw: int) -> None:
    order = np.random.default_rng(draw).permutation(60)
    base = pool[pool["repeat"].isin(order[:10])]
    current = pool[pool["repeat"].isin(order[10:20])]
    # threshold 0: the statistics alone must keep the false alarms out
    table = compare_values(base, current, Settings(seed=draw, threshold=0.0))
    assert len(table) == 34 and (table["n_base"] == 10).all()
    assert "regressed" not in set(table["verdict"])
    assert "improved" not in set(table["verdict"])


def test_a_30_percent_slowdown_is_regressed_and_the_mirror_improved() -> None:
    base, slow = values(10, seed=6), values(10, seed=7, factor=1.3)
    table = compare_values(base, slow)
    step, rate = row(table, "step_time_ms"), row(table, "samples_per_s")
    assert step["verdict"] == rate["verdict"] == "regressed"
    assert step["ratio"] == pytest.approx(1.3, rel=0.06)
    assert step["ci_low"] <= step["ratio"] <= step["ci_high"]
    assert rate["better"] == "higher" and rate["ratio"] < 1 / 1.1
    mirror = compare_values(slow, base)
    assert row(mirror, "step_time_ms")["verdict"] == "improved"
    assert row(mirror, "samples_per_s")["verdict"] == "improved"


def test_a_small_significant_change_is_not_a_regression() -> None:
    quiet = {"step_noise": 0.002, "run_noise": 0.002}
    table = compare_values(values(10, seed=8, **quiet), values(10, seed=9, factor=1.03, **quiet))
    step = row(table, "step_time_ms")
    assert step["p_adjusted"] < 0.002  # real,
    assert step["ratio"] == pytest.approx(1.03, rel=0.01)  # but small:
    assert step["verdict"] == "unchanged"
    assert "regressed" not in set(table["verdict"])


def test_per_metric_threshold_overrides_the_default() -> None:
    base, slow = values(10, seed=10), values(10, seed=11, factor=1.3)
    settings = Settings(metric_thresholds=(("step_time_ms", 0.5), ("phase_*", 1.0)))
    table = compare_values(base, slow, settings)
    assert row(table, "step_time_ms")["verdict"] == "unchanged"
    assert row(table, "samples_per_s")["verdict"] == "regressed"
    assert row(table, "phase_forward_ms", 0)["threshold"] == 1.0
    assert row(table, "phase_forward_ms", 0)["verdict"] == "unchanged"


def test_fewer_metrics_need_fewer_repeats() -> None:
    base, slow = values(8, seed=12), values(8, seed=13, factor=1.3)
    everything = compare_values(base, slow)
    assert set(everything["verdict"]) == {"inconclusive"}  # 34 metrics need 9 per side
    two = compare_values(base, slow, Settings(metrics=("step_time_ms", "samples_per_s")))
    assert list(two["verdict"]) == ["regressed", "regressed"]


def test_too_few_repeats_is_inconclusive_even_for_identical_groups() -> None:
    same = values(3, seed=14)
    table = compare_values(same, same)
    assert set(table["verdict"]) == {"inconclusive"}
    assert not table["reachable"].any()


# -- run folders, environment ---------------------------------------------------------------


def test_environment_and_configuration_differences_warn(tmp_path: Path) -> None:
    base = write_group(tmp_path / "base", 2, seed=15)
    other = {**ENVIRONMENT, "cpu_count": 4,
             "libraries": {**ENVIRONMENT["libraries"], "torch": "2.14.0"}}
    current = write_group(tmp_path / "current", 2, seed=16, environment=other,
                          run={**RUN, "global_batch": 128})
    warnings = compare_paths(base, current).warnings
    text = "\n".join(warnings)
    assert "environment differs: cpu_count: BASE 2; CURRENT 4" in text
    assert "environment differs: library torch: BASE 2.13.0; CURRENT 2.14.0" in text
    assert "configuration differs for gen/pair: run.global_batch" in text
    same = "\n".join(compare_paths(base, base).warnings)
    assert "differs" not in same
    # a worker field a later hetbench records, unset: the same configuration; set: not
    later = {**RUN, "workers": [{**w, "loader_workers": None} for w in RUN["workers"]]}
    unset = write_group(tmp_path / "unset", 2, seed=15, run=later)
    assert "differs" not in "\n".join(compare_paths(base, unset).warnings)
    starved = {**RUN, "workers": [RUN["workers"][0], {**RUN["workers"][1], "loader_workers": 0}]}
    loaded = write_group(tmp_path / "loaded", 2, seed=15, run=starved)
    assert "configuration differs for gen/pair: run.workers" in "\n".join(
        compare_paths(base, loaded).warnings)


def test_failed_and_unmatched_runs_are_left_out_with_a_warning(tmp_path: Path) -> None:
    rng = np.random.default_rng(17)
    base, current = tmp_path / "base", tmp_path / "current"
    write_run(base, 0, generate_steps(rng))
    write_run(base, 1, generate_steps(rng, factor=5.0), status="failed")
    write_run(base, 0, generate_steps(rng), run={**RUN, "name": "solo"})
    write_run(current, 0, generate_steps(rng))
    comparison = compare_paths(base, current)
    text = "\n".join(comparison.warnings)
    assert "left out (status failed)" in text
    assert "gen/solo is only in BASE" in text
    assert set(comparison.table["n_base"]) == {1}


def test_metric_values_of_loaded_runs(groups: dict[str, Path]) -> None:
    run = load_run(groups["few_base"] / "gen" / "pair-r0")
    v = metric_values([run])
    assert list(v.columns) == ["suite", "run", "repeat", "run_id", "worker", "metric", "value"]
    assert set(v["suite"]) == {"gen"} and set(v["run"]) == {"pair"}


# -- the command ----------------------------------------------------------------------------


def hetbench_compare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["compare", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_identical_groups_exit_0_on_the_metrics_they_show_unchanged(
        groups: dict[str, Path], capsys) -> None:
    status, out, _ = hetbench_compare(capsys, str(groups["base"]), str(groups["base"]),
                                      "--metrics", "step_time_ms,samples_per_s")
    assert status == 0
    assert "verdict: UNCHANGED" in out
    # on every metric: never a regression, but noisy ones cannot be shown unchanged
    status, out, _ = hetbench_compare(capsys, str(groups["base"]), str(groups["base"]))
    assert status == 3 and "verdict: INCONCLUSIVE (0 regressed, 0 improved" in out


def test_cli_slowdown_exits_1_with_a_table(groups: dict[str, Path], capsys) -> None:
    status, out, _ = hetbench_compare(capsys, str(groups["base"]), str(groups["slow"]))
    assert status == 1
    line = next(ln for ln in out.splitlines() if " step_time_ms " in ln)
    assert line.startswith("gen/pair") and line.rstrip().endswith("regressed")
    assert "verdict: REGRESSED" in out


def test_cli_too_few_repeats_exits_3(groups: dict[str, Path], capsys) -> None:
    status, out, _ = hetbench_compare(capsys, str(groups["few_base"]), str(groups["few_slow"]))
    assert status == 3
    assert "at least 9 per side are needed" in out
    assert "regressed" not in out.replace("0 regressed", "")


def test_cli_json_parses(groups: dict[str, Path], capsys) -> None:
    status, out, _ = hetbench_compare(capsys, str(groups["base"]), str(groups["slow"]),
                                      "--json", "--metric-threshold", "phase_*=0.5")
    report = json.loads(out)
    assert status == report["exit_status"] == 1
    assert report["verdict"] == "regressed" and report["correction"] == "holm"
    assert report["metric_thresholds"] == {"phase_*": 0.5}
    assert report["min_repeats_per_side"] == 9
    step = next(m for m in report["metrics"]
                if m["metric"] == "step_time_ms" and m["worker"] is None)
    assert step["verdict"] == "regressed" and step["n_base"] == 10


def test_cli_json_without_enough_repeats(groups: dict[str, Path], capsys) -> None:
    status, out, _ = hetbench_compare(capsys, str(groups["few_base"]), str(groups["few_base"]),
                                      "--json")
    report = json.loads(out)
    assert status == 3 and report["verdict"] == "inconclusive"
    assert any("9 per side" in w for w in report["warnings"])


@pytest.mark.parametrize(("args", "expected"), [
    (["{missing}", "{base}"], "no such file or directory"),
    (["{empty}", "{base}"], "no run directories below it"),
    (["{base}", "{base}", "--threshold", "-1"], "--threshold: -1.0 is not allowed"),
    (["{base}", "{base}", "--alpha", "2"], "--alpha: 2.0 is not allowed"),
    (["{base}", "{base}", "--metric-threshold", "step_time"], "is not NAME=X"),
    (["{base}", "{base}", "--metric-threshold", "speed=0.2"], "'speed' matches no metric"),
    (["{base}", "{base}", "--metrics", "nope"], "--metrics: 'nope' matches no metric"),
], ids=["missing", "empty", "threshold", "alpha", "pair", "unknown metric", "metrics"])
def test_cli_bad_input_is_one_line_exit_2(groups: dict[str, Path], tmp_path: Path, capsys,
                                          args: list[str], expected: str) -> None:
    (tmp_path / "empty").mkdir()
    names = {"missing": tmp_path / "nope", "empty": tmp_path / "empty",
             "base": groups["few_base"]}
    status, out, err = hetbench_compare(capsys, *(a.format(**names) for a in args))
    assert status == 2, out
    assert len(err.splitlines()) == 1 and err.startswith("hetbench: error: ")
    assert expected in err


def test_unknown_schema_exits_2_in_one_line_end_to_end(tmp_path: Path, spawn: Spawn) -> None:
    run_dir = write_run(tmp_path / "base", 0, generate_steps(np.random.default_rng(18)))
    meta = json.loads((run_dir / "manifest.json").read_text())
    meta["schema_version"] = 99
    (run_dir / "manifest.json").write_text(json.dumps(meta))
    result = spawn.run(hetbench_command("compare", str(tmp_path / "base"),
                                        str(tmp_path / "base")),
                       capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "schema_version 99 is not supported" in result.stderr


def test_steps_of_another_schema_exit_2(tmp_path: Path, capsys) -> None:
    run_dir = write_run(tmp_path / "base", 0, generate_steps(np.random.default_rng(19)))
    collector.write_steps(run_dir, pd.DataFrame({"rank": [0], "when": [1]}))
    status, _, err = hetbench_compare(capsys, str(run_dir), str(run_dir))
    assert status == 2 and "lacks column(s) step, batch_size" in err
    assert err.startswith(f"hetbench: error: {run_dir / 'steps.parquet'}: ")


# -- hetbench ci: the parts that start no training (the rounds themselves are measured, see
# the report of issue 6) --------------------------------------------------------------------

TINY_PAIR = """
[suite]
name = "tiny-ci"
repeats = 5

[[runs]]
name = "pair"
steps = 6
global_batch = 32
workers = [ { device = "cpu", threads = 1 }, { device = "cpu", threads = 1 } ]
"""


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs a git checkout")
def test_ci_runs_both_sides_interleaved_and_removes_the_worktree(tmp_path: Path,
                                                                  spawn: Spawn) -> None:
    """End to end: the base in a temporary worktree of HEAD, the working tree as current,
    two rounds of one launch per side, then the comparison (too few rounds: exit 3)."""
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY_PAIR)
    out = tmp_path / "ci"
    done = spawn.run(
        [*hetbench_command(), "ci", str(suite), "--base", "HEAD", "--repeats", "2",
         "--out", str(out), "--json", "--history", str(tmp_path / "history")],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "inconclusive"
    # the gate kept in the history, with the commit it judged against its base
    kept = [json.loads(p.read_text()) for p in (tmp_path / "history").glob("*.json")]
    assert len(kept) == 1 and kept[0]["base"] == kept[0]["commit"]  # HEAD against HEAD
    assert "no drift shown" in done.stderr
    # the gate's rows: its metrics, the felt ones and where a change would be
    roles = {m["metric"]: m["role"] for m in result["metrics"]}
    assert {k for k, v in roles.items() if v == "gate"} == {"cpu_per_sample_us",
                                                           "compute_busy_ms"}
    assert {k for k, v in roles.items() if v == "felt"} == {"step_time_ms", "samples_per_s"}
    assert result["paired"] is True and result["rounds"] == 2
    rounds = [line.split()[2] for line in done.stderr.splitlines() if line.startswith("round")]
    assert rounds == ["base", "current", "current", "base"]
    for side in ("base", "current"):
        runs = [load_run(d) for d in sorted((out / side).glob("*/*")) if d.is_dir()]
        assert len(runs) == 2 and all(r.status == "completed" for r in runs)
    worktrees = spawn.run(["git", "-C", str(REPO), "worktree", "list"],
                          capture_output=True, text=True).stdout
    assert "hetbench-base-" not in worktrees


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs a git checkout")
def test_a_signal_to_ci_closes_the_launch_in_progress(tmp_path: Path, spawn: Spawn) -> None:
    """Issue 58 (2): SIGTERM (a CI runner's cancel, `timeout`) to `hetbench ci` mid-launch
    reaches the launch, which closes its run `interrupted` with its records and removes its
    TMPDIR; the worktree goes; exit 143. (The launch used to be SIGKILLed: its run stayed
    `running`, its TMPDIR behind, and nothing said `hetbench recover`.)"""
    suite = tmp_path / "long.toml"
    suite.write_text(TINY_PAIR.replace("steps = 6", "steps = 100000"))
    out = tmp_path / "ci"
    proc = spawn([*hetbench_command(), "ci", str(suite), "--base", "HEAD", "--repeats", "1",
                  "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True)
    deadline = time.monotonic() + 240
    while not [p for p in (out / "base").glob("*/*/parts/rank0.bin") if p.stat().st_size]:
        assert proc.poll() is None and time.monotonic() < deadline, "no step flushed"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "passed on to the base side's launch" in err and "ended (exit status" in err, err
    [run_dir] = [d for d in (out / "base").glob("*/*") if d.is_dir()]
    run = load_run(run_dir)
    assert (run.status, run.manifest["reason"]) == ("interrupted", "interrupted by SIGTERM")
    assert len(run.steps) == run.manifest["rows"] > 0
    assert not Path(run.manifest["tmp"]).exists()
    worktrees = spawn.run(["git", "-C", str(REPO), "worktree", "list"],
                          capture_output=True, text=True).stdout
    assert "hetbench-base-" not in worktrees


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs a git checkout")
def test_ci_with_an_unknown_base_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    status = main(["ci", "--base", "no-such-ref-6c1f", "--out", str(tmp_path / "ci")])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1
    assert "--base: 'no-such-ref-6c1f' is not a commit" in err
    assert not (tmp_path / "ci").exists()


USER_JOB = """
import torch
from torch import nn
from torch.utils.data import TensorDataset
import hetbench


def make():
    x = torch.randn(128, 8, generator=torch.Generator().manual_seed(3))
    return hetbench.Job(model=nn.Linear(8, 2), loss=nn.CrossEntropyLoss(), reduction="mean",
                        train=TensorDataset(x, (x[:, 0] > 0).long()))
"""


@pytest.mark.slow
def test_ci_refuses_a_base_whose_tree_lacks_the_job_before_anything_runs(
        tmp_path: Path, spawn: Spawn) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("a user's project, before its model\n")
    for words in (["init", "-q"], ["add", "."], ["-c", "user.name=u", "-c",
                                                  "user.email=u@example.org", "commit", "-qm",
                                                  "one"]):
        spawn.run(["git", *words], cwd=repo, check=True, timeout=60)
    (repo / "userjob.py").write_text(USER_JOB)  # the working tree's job, not in HEAD
    (repo / "suite.toml").write_text('[suite]\nname = "mine"\n\n[[runs]]\nname = "pair"\n'
                                     'workload = "userjob:make"\nsteps = 4\n'
                                     'global_batch = 32\nworkers = [{}, {}]\n')
    done = spawn.run(hetbench_command("ci", "--base", "HEAD", "suite.toml", "--repeats", "1",
                                      "--no-baseline", "--out", "ci"), cwd=repo,
                     capture_output=True, text=True, timeout=300)
    # it was: every base run failed, the working tree ran anyway, then "internal error:
    # KeyError: 'suite'"
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("hetbench: error")]
    assert len(errors) == 1 and errors[0].startswith(
        "hetbench: error: --base HEAD: its tree cannot run the suite's jobs: runs[0].workload: "
        "cannot import 'userjob'"), done.stderr
    assert not list((repo / "ci").rglob("current-*.log"))  # the working tree never ran


def test_ci_rejects_zero_rounds(tmp_path: Path, capsys) -> None:
    status = main(["ci", "--base", "HEAD", "--repeats", "0", "--out", str(tmp_path / "ci")])
    assert status == 2 and "--repeats: 0 is not allowed" in capsys.readouterr().err


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs a git checkout")
def test_ci_counts_failing_runs_of_the_working_tree_as_a_regression(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """compare leaves failed runs out, so a tree whose runs fail would otherwise pass as
    `inconclusive`. The launches and the comparison are stubbed: this is the decision."""
    from types import SimpleNamespace

    import hetbench.harness.cli.ci as ci
    from hetbench.analysis.tables import paired
    from hetbench.harness.cli import gate_report

    launches: list[str] = []

    def fake_side(side: str, *args: object, **options: object) -> int:
        launches.append(side)
        return 1 if side == "current" and len(launches) == 2 else 0

    monkeypatch.setattr(ci, "run_side", fake_side)
    monkeypatch.setattr(paired, "compare_paired",
                        lambda *a: SimpleNamespace(exit_status=3, verdict="inconclusive"))
    monkeypatch.setattr(gate_report, "format_table", lambda *a: "")
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY_PAIR)
    status = main(["ci", str(suite), "--base", "HEAD", "--repeats", "2",
                   "--out", str(tmp_path / "ci")])
    assert launches == ["base", "current", "current", "base"]
    assert status == 1
    assert "1 launch(es) of the working tree had runs that did not complete" in \
        capsys.readouterr().err


def test_cli_leads_with_the_verdict_and_lists_the_largest_changes_first(
        groups: dict[str, Path], capsys) -> None:
    status, out, _ = hetbench_compare(capsys, str(groups["base"]), str(groups["slow"]))
    lines = out.splitlines()
    assert status == 1 and lines[0].startswith("verdict: REGRESSED (")
    rows = [ln.split() for ln in lines if ln.startswith("gen/pair")]
    assert rows and all(r[-1] != "unchanged" for r in rows)
    sizes = [abs(math.log(float(r[7]))) for r in rows]  # ratios printed to 3 digits
    assert all(a >= b - 0.005 for a, b in zip(sizes, sizes[1:], strict=False))
    assert "nan" not in out.split("metrics);")[1]  # no interval printed as nan-nan
    listed_all = hetbench_compare(capsys, str(groups["base"]), str(groups["slow"]), "--all")[1]
    assert len([ln for ln in listed_all.splitlines() if ln.startswith("gen/pair")]) == 34


def test_the_gate_reports_the_committed_baseline_without_gating_on_it(tmp_path: Path,
                                                                       capsys) -> None:
    """A working tree 1.3x slower than the committed baseline (a drift HEAD~1 cannot show):
    the regression is reported beside the gate's own verdict, whose exit status it leaves
    alone; a missing baseline is one line."""
    from hetbench.analysis.tables.compare import Settings
    from hetbench.harness.cli.ci import against_baseline

    baseline = write_group(tmp_path / "baseline", 12, seed=31)
    current = write_group(tmp_path / "current", 12, seed=32, factor=1.3)
    against_baseline(baseline, current, Settings(), as_json=False)
    captured = capsys.readouterr()
    assert "against the committed baseline" in captured.out
    assert "verdict: REGRESSED" in captured.out
    assert "regressed (step_time_ms x1.2" in captured.err and "not gating" in captured.err
    against_baseline(baseline, current, Settings(), as_json=True)  # stdout stays one JSON
    captured = capsys.readouterr()
    assert captured.out == "" and "regressed" in captured.err
    against_baseline(tmp_path / "none", current, Settings(), as_json=False)
    assert "no committed baseline at" in capsys.readouterr().err
