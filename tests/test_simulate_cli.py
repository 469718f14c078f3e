"""`hetbench simulate` end to end on recorded runs built by hand: run directories the
analysis reads, the summary and the scale figure, and bad input refused up front."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hetbench.harness.cli.main import main
from hetbench.harness.records import collector, manifest
from hetbench.harness.records.results import load_run
from tests.synthetic import steps_frame
from tests.test_simulate import recorded


def write_recorded(folder: Path, name: str = "pair", status: str = "completed") -> Path:
    """A run directory of a pair: worker 0 3x slower (6 ms), worker 1 2 ms, with noise."""
    noise = np.random.default_rng(0).lognormal(0, 0.2, size=(60, 2))
    meta, frame = recorded(steps_frame(60, lambda r, s: [6.0, 2.0][r] * noise[s, r],
                                       batch=lambda r: [16, 48][r]),
                           slowdowns=(3.0, 1.0), name=name, run_id=f"{name}-r0-x")
    run_dir = folder / "synthetic" / f"{name}-r0-x"
    run_dir.mkdir(parents=True)
    full = manifest.new(meta["suite"], meta["run"], 0, meta["run_id"], {"host": "test"},
                        "emulated")
    full.update(status=status, workers=meta["workers"])
    manifest.write(run_dir, full)
    collector.write_steps(run_dir, frame)
    return run_dir


def test_mixes_and_schemes_write_runs_the_analysis_reads(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    source = write_recorded(tmp_path / "in")
    out = tmp_path / "out"
    status = main(["simulate", str(source), "--mix", "cpu-3x:2,cpu:6", "--mix",
                   "cpu-3x:8,cpu:24", "--scheme", "bsp", "--scheme", "ssp:2",
                   "--steps", "40", "--out", str(out)])
    assert status == 0
    (summary,) = (out / "simulate").glob("summary-*.csv")
    table = pd.read_csv(summary)
    assert sorted(zip(table["workers"], table["scheme"], strict=True)) == [
        (8, "bsp"), (8, "ssp:2"), (32, "bsp"), (32, "ssp:2")]
    launch = summary.stem.removeprefix("summary-")
    assert (out / "simulate" / "figures" / f"scale-{launch}.png").is_file()
    runs = [load_run(Path(p)) for p in table["run"]]
    for run in runs:
        assert run.manifest["simulated"]["from"] == ["pair-r0-x"]
        # 40 global batches: bsp in 40 steps together; ssp, as its runs end, once the
        # pushes served carry them (a fast worker may be a step ahead then)
        assert run.steps["batch_size"].sum() == 40 * run.manifest["run"]["global_batch"]
        if run.manifest["run"]["name"].startswith("bsp"):
            assert run.steps["step"].nunique() == 40
    bsp32 = next(r for r in runs if r.manifest["run"]["name"] == "bsp-n32")
    # weak scaling: the recorded 32 samples per worker
    assert bsp32.steps.groupby("step")["batch_size"].sum().iloc[0] == 32 * 32
    assert main(["report", str(out / "simulate"), "--no-figures"]) == 0
    assert "bsp-n32" in capsys.readouterr().out


def test_without_a_mix_the_recorded_configuration_is_simulated(tmp_path: Path) -> None:
    source = write_recorded(tmp_path / "in")
    out = tmp_path / "out"
    assert main(["simulate", str(source), "--out", str(out), "--repeats", "2"]) == 0
    (summary,) = (out / "simulate").glob("summary-*.csv")
    table = pd.read_csv(summary)
    assert table["mix"].tolist() == ["rank0:1,rank1:1"] * 2
    run = load_run(Path(table["run"].iloc[0]))
    assert run.steps.groupby("rank")["batch_size"].first().tolist() == [16, 48]
    assert table["seconds"].notna().all()


@pytest.mark.parametrize(("arguments", "says"), [
    (["--mix", "gpu:4"], "--mix: no device class or profile 'gpu'"),
    (["--mix", "cpu:0"], "--mix: 'cpu:0': the count must be 1 to"),
    (["--mix", "cpu"], "--mix: 'cpu' is not NAME:COUNT"),
    (["--scheme", "ring"], "--scheme: 'ring' is not a scheme"),
    (["--scheme", "ssp"], "--scheme: 'ssp': ssp takes ssp:S"),
    (["--steps", "0"], "--steps: 0 is outside 1..1,000,000"),
    (["--global-batch", "3", "--mix", "cpu:4"], "--global-batch: 3 samples cannot be shared"),
])
def test_bad_input_is_one_line_and_nothing_written(tmp_path: Path, capsys, arguments: list[str],  # type: ignore[no-untyped-def]
                                                    says: str) -> None:
    source = write_recorded(tmp_path / "in")
    out = tmp_path / "out"
    assert main(["simulate", str(source), "--out", str(out), *arguments]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and says in error, error
    assert not out.exists()


def test_a_run_that_cannot_be_fitted_is_named(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    write_recorded(tmp_path / "in", "good")
    write_recorded(tmp_path / "in", "broken", status="failed")
    assert main(["simulate", str(tmp_path / "in"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "run broken-r0-x: status failed" in error
    # -k picks the runs to fit
    assert main(["simulate", str(tmp_path / "in"), "-k", "good", "--out",
                 str(tmp_path / "out")]) == 0


def test_no_results_needs_profiles(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", "--out", str(tmp_path / "out")]) == 2
    assert "give recorded runs to fit, or --mix with named profiles" in capsys.readouterr().err


RECORDED = """
[suite]
name = "recorded"
repeats = 3

[[runs]]
name = "pair"
framework = "pytorch"
workload = "mlp"
dataset = "digits"
steps = 70
warmup_steps = 10
global_batch = 64
workers = [ { device = "cpu", slowdown = 3.0 }, { device = "cpu" } ]
"""


def test_the_recorded_configuration_is_reproduced_within_its_run_to_run_spread(
        tmp_path: Path, write_suite) -> None:  # type: ignore[no-untyped-def]
    """Real runs, fitted and simulated as recorded: the simulated mean step time and idle
    fraction fall inside the spread of the repeats themselves (their range, widened by its
    own width on either side, and by at least 5% of the mean step time and 2 points of
    idle: three repeats can agree by chance). On two shared cores the repeats of one
    suite differ by 10-30%, so this is what 'reproduces' can mean here."""
    from hetbench.analysis.models import deviceclass, simulate
    from hetbench.analysis.view.metrics import run_summary
    from hetbench.harness.records.results import find_runs

    results = tmp_path / "results"
    assert main(["run", str(write_suite(RECORDED)), "--out", str(results), "--no-figures"]) == 0
    runs = [load_run(p) for p in find_runs([results / "recorded"])]
    # steps.parquet itself says which run, launch and repeat a row is, and which are warm-up
    written = pd.read_parquet(runs[0].run_dir / "steps.parquet")
    assert set(written["run_id"]) == {runs[0].manifest["run_id"]}
    assert set(written["launch"]) == {runs[0].launch}
    assert written["warmup"].sum() == 2 * 10 and written["repeat"].nunique() == 1
    real = pd.DataFrame([run_summary(r.steps, r.warmup_steps) for r in runs])
    classes, names = deviceclass.fit_classes(runs)
    workers, _ = deviceclass.resolve_mix(deviceclass.recorded_mix(runs, names), classes, names)
    comm = deviceclass.fit_comm(runs)
    simulated = []
    for seed in range(30):  # simulated repeat r keeps to recorded repeat r mod 3: 10 each
        sim = simulate.simulate(workers, comm, simulate.Scheme("bsp"), 70, 64, seed=seed,
                                sizes=(32, 32))
        frame = collector.records_frame([simulate.records(sim)])
        simulated.append(run_summary(frame, 10))
    guess = pd.DataFrame(simulated).mean()
    for metric, floor in (("mean_step_ms", 0.05 * real["mean_step_ms"].mean()),
                          ("idle_fraction", 0.02)):
        low, high = real[metric].min(), real[metric].max()
        margin = max(high - low, floor)
        assert low - margin <= guess[metric] <= high + margin, (metric, guess[metric],
                                                                real[metric].tolist())


def test_load_steps_gives_many_runs_as_one_tidy_frame(tmp_path: Path) -> None:
    from hetbench.harness.records.results import load_steps

    write_recorded(tmp_path / "in", "a")
    write_recorded(tmp_path / "in", "b")
    steps = load_steps(tmp_path / "in")
    assert steps.columns[:6].tolist() == ["suite", "run", "run_id", "launch", "repeat",
                                          "warmup"]
    assert steps.groupby("run")["run_id"].first().to_dict() == {"a": "a-r0-x", "b": "b-r0-x"}
    assert len(steps) == 2 * 60 * 2 and not steps["warmup"].any()
