"""Errors are for people (DESIGN.md principle 7), end to end through the `hetbench` process:
one line naming the field or path, exit status 2, no traceback unless --debug. None of these
tests starts a worker."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Spawn

TIMEOUT_S = 60

GPU_SUITE = """
[suite]
name = "needs-gpu"

[[runs]]
name = "on-gpu"
steps = 2
global_batch = 8
workers = [ { device = "cuda:7" } ]
"""




def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a usage error, after checking the contract around it."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hetbench: error: ")
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


@pytest.fixture(scope="module")
def cuda_7_missing() -> None:
    from hetbench.harness.run.launcher import gpu_count  # probes in a subprocess: no torch here

    if gpu_count("pytorch") > 7:
        pytest.skip("this host has a cuda:7")


@pytest.mark.parametrize(("body", "where", "allowed"), [
    ('[[runs]]\nname = "r"\nsteps = "many"\n', "runs[0].steps", "must be an integer"),
    ('[[runs]]\nname = "r"\nworkers = [ { device = "cpu", thread = 2 } ]\n',
     "runs[0].workers[0].thread",
     "allowed: cores, device, framework, jitter, loader_workers, node, slowdown, slowdown_at, "
     "threads"),
    ('[[runs]]\nname = "r"\nframework = "jax"\n', "runs[0].framework", "pytorch"),
    ('[[runs]]\nname = "r"\nglobal_batch = 128\nworkers = [ {}, {} ]\n'
     'partition = { policy = "sizes", sizes = [100, 20] }\n',
     "runs[0].partition.sizes", "must equal global_batch 128"),
    ('[[runs]]\nname = "r"\nworkers = [ { device = "gpu" } ]\n',
     "runs[0].workers[0].device", "(cpu, cuda:N)"),
], ids=["type", "worker key", "framework", "sizes", "device"])
def test_bad_suite_is_one_line_naming_the_field(tmp_path: Path, write_suite, body: str,
                                                where: str, allowed: str, hetbench) -> None:
    suite = write_suite(body)
    line = error_line(hetbench(tmp_path, "run", str(suite), "--out", str(tmp_path / "out")))
    assert line.startswith(f"hetbench: error: {where}: ")
    assert allowed in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("content", "damage"), [
    (os.urandom(64).replace(b"{", b"x"), "unreadable manifest: "),
    (json.dumps({"schema_version": 999, "run_id": "x"}).encode(),
     "schema_version 999 is not supported (this hetbench reads "),
], ids=["random bytes", "newer schema"])
def test_a_run_it_cannot_read_in_the_out_folder_is_one_line(
        tmp_path: Path, write_suite, content: bytes, damage: str, hetbench) -> None:
    """A run was added beside it, and `report` then failed on the old one."""
    suite = write_suite('[suite]\nname = "s"\n[[runs]]\nname = "r"\nsteps = 2\n')
    old = tmp_path / "out" / "s" / "r-r0-20260101T000000"
    old.mkdir(parents=True)
    (old / "manifest.json").write_bytes(content)
    line = error_line(hetbench(tmp_path, "run", str(suite), "--out", str(tmp_path / "out")))
    assert line.startswith(f"hetbench: error: {old / 'manifest.json'}: {damage}"), line
    assert line.endswith("; `hetbench run` adds no run beside a run it cannot read: move it "
                         "aside or choose another --out")
    assert [p.name for p in (tmp_path / "out" / "s").iterdir()] == [old.name]  # none added
    assert (old / "manifest.json").read_bytes() == content


def test_unwritable_out_is_one_line_before_anything_runs(tmp_path: Path, write_suite,
                                                         hetbench) -> None:
    suite = write_suite('[[runs]]\nname = "r"\nsteps = 2\n')
    (tmp_path / "taken").write_text("a file, not a folder")
    line = error_line(hetbench(tmp_path, "run", str(suite), "--out", str(tmp_path / "taken")))
    assert line.startswith("hetbench: error: --out: ") and "not a writable folder" in line
    assert (tmp_path / "taken").read_text() == "a file, not a folder"


def test_an_out_folder_that_cannot_hold_the_suite_is_refused_before_its_banner(
        tmp_path: Path, write_suite, hetbench) -> None:
    """The suite's folder under --out a file (refused only after the run's banner was
    printed), --out in /proc (refused as "No such file or directory")."""
    suite = write_suite('[suite]\nname = "s"\n[[runs]]\nname = "r"\nsteps = 2\n')
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "s").write_text("a file where the suite's folder would go")
    done = hetbench(tmp_path, "run", str(suite), "--out", str(tmp_path / "out"))
    assert error_line(done) == f"hetbench: error: --out: {tmp_path / 'out' / 's'} is a file, " \
                               "not a folder"
    assert done.stdout == ""
    assert error_line(hetbench(tmp_path, "run", str(suite), "--out", "/proc")) == (
        "hetbench: error: --out: /proc/s is not a writable folder (nothing can be created "
        "in /proc)")


def test_k_is_refused_empty_and_lists_a_few_runs_when_none_matches(
        tmp_path: Path, write_suite, hetbench) -> None:
    """An empty -k matched every run; a -k matching none of 30 runs names 10 and counts
    the rest (a suite of 10,000 runs printed one line of 69 KB)."""
    runs = "".join(f'[[runs]]\nname = "run{i:02d}"\nsteps = 2\n' for i in range(30))
    suite = write_suite(f'[suite]\nname = "s"\n{runs}')
    for command in ("run", "advise", "simulate"):
        empty = hetbench(tmp_path, command, str(suite), "-k", "")
        assert empty.returncode == 2 and empty.stderr.splitlines()[-1].endswith(
            "error: argument -k: empty: it would match every run (leave -k out to take them "
            "all)"), (command, empty.stderr)
    line = error_line(hetbench(tmp_path, "run", str(suite), "-k", "nomatch", "--out",
                               str(tmp_path / "out")))
    names = ", ".join(f"run{i:02d}" for i in range(10))
    assert line == f"hetbench: error: -k: no run matches 'nomatch' (runs: {names} and 20 more)"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", ["list", "no run"])
def test_report_of_a_manifest_that_is_not_hetbench_is_one_line(tmp_path: Path,
                                                               content: str, hetbench) -> None:
    from hetbench.harness import SCHEMA_VERSION

    run_dir = tmp_path / "odd"
    run_dir.mkdir()
    manifest = [1, 2] if content == "list" else {"schema_version": SCHEMA_VERSION}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    line = error_line(hetbench(tmp_path, "report", str(run_dir)))
    assert str(run_dir / "manifest.json") in line


def test_debug_shows_the_traceback(tmp_path: Path, write_suite, hetbench) -> None:
    suite = write_suite('[[runs]]\nname = "r"\nsteps = "many"\n')
    result = hetbench(tmp_path, "--debug", "run", str(suite))
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "UsageError: runs[0].steps: must be an integer" in result.stderr


def test_invalid_toml_is_one_line_naming_the_file(tmp_path: Path, write_suite, hetbench) -> None:
    suite = write_suite('[[runs]\nname = "r"\n')
    line = error_line(hetbench(tmp_path, "run", str(suite)))
    assert line.startswith(f"hetbench: error: {suite}: invalid TOML")


def test_missing_suite_file_names_the_path(tmp_path: Path, hetbench) -> None:
    missing = tmp_path / "nowhere" / "suite.toml"
    line = error_line(hetbench(tmp_path, "run", str(missing)))
    assert line == f"hetbench: error: {missing}: no such file"


def test_unknown_builtin_suite_lists_the_builtins(tmp_path: Path, hetbench) -> None:
    line = error_line(hetbench(tmp_path, "run", "no-such-suite"))
    assert "'no-such-suite' is neither a file nor a built-in suite" in line
    assert "quick" in line


def test_help_exits_zero(tmp_path: Path, hetbench) -> None:
    result = hetbench(tmp_path, "--help")
    assert result.returncode == 0
    assert "usage: hetbench" in result.stdout
    assert "run" in result.stdout
    assert result.stderr == ""


def test_cli_imports_no_framework(tmp_path: Path, spawn: Spawn) -> None:
    code = ("import sys; import hetbench.harness.cli.main as m; m.build_parser()\n"
            "loaded = [f for f in ('torch', 'tensorflow', 'mxnet') if f in sys.modules]\n"
            "assert not loaded, loaded")
    result = spawn.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr


def test_a_command_loads_only_its_own_module(tmp_path: Path, spawn: Spawn) -> None:
    """Each subcommand's module costs ~0.4 s of every start: `hetbench --debug suites`
    defines the suites command's arguments and loads no other command's module."""
    code = ("import sys; import hetbench.harness.cli.main as m\n"
            "m.build_parser(m.named_command(['--debug', 'suites', 'quick']))\n"
            "loaded = sorted(n for n in sys.modules if n.startswith('hetbench.harness.cli.')\n"
            "                and n not in ('hetbench.harness.cli.main',\n"
            "                              'hetbench.harness.cli.suites'))\n"
            "assert 'hetbench.harness.cli.suites' in sys.modules\n"
            "assert not {f'hetbench.harness.cli.{c}' for c in m.SUBCOMMANDS} & set(loaded), loaded")
    result = spawn.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr


@pytest.mark.usefixtures("cuda_7_missing")
def test_missing_gpu_is_a_usage_error(tmp_path: Path, write_suite, hetbench) -> None:
    suite = write_suite(GPU_SUITE)
    out = tmp_path / "out"
    line = error_line(hetbench(tmp_path, "run", str(suite), "--out", str(out), "--no-progress"))
    assert line.startswith("hetbench: error: runs[0].workers[0].device: cuda:7 not available")
    assert not list(out.glob("*/*"))  # nothing recorded when the suite is refused


@pytest.mark.usefixtures("cuda_7_missing")
def test_skip_unavailable_records_a_skipped_run(tmp_path: Path, write_suite, hetbench) -> None:
    suite = write_suite(GPU_SUITE)
    out = tmp_path / "out"
    result = hetbench(tmp_path, "run", str(suite), "--out", str(out), "--skip-unavailable",
                      "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    (run_dir,) = (out / "needs-gpu").iterdir()
    assert run_dir.name.startswith("on-gpu-r0-")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "skipped"
    assert manifest["reason"].startswith("runs[0].workers[0].device: cuda:7 not available")
    assert manifest["run"]["name"] == "on-gpu"
    assert manifest["end"] is not None
    assert not (run_dir / "logs").exists()  # no worker was started
    assert "1 skipped" in result.stdout


def test_a_gpu_the_framework_cannot_see_is_refused_before_anything_runs(
        tmp_path: Path, write_suite, hetbench) -> None:
    """torch may see a GPU that tensorflow-cpu does not: each framework is asked itself."""
    from hetbench.harness.run.launcher import gpu_count

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    if gpu_count("tensorflow") > 0:
        pytest.skip("tensorflow sees a GPU here")
    suite = write_suite(GPU_SUITE.replace('device = "cuda:7"',
                                          'device = "cuda:0", framework = "tensorflow"'))
    out = tmp_path / "out"
    line = error_line(hetbench(tmp_path, "run", str(suite), "--out", str(out), "--no-progress"))
    assert line.startswith("hetbench: error: runs[0].workers[0].device: cuda:0 not available "
                           "(tensorflow sees 0 GPU(s)")
    assert not list(out.glob("*/*"))


def test_suites_lists_the_builtins_and_prints_one_to_copy(tmp_path: Path, hetbench) -> None:
    listing = hetbench(tmp_path, "suites")
    assert listing.returncode == 0, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines() if line.strip()}
    assert "Heterogeneous CPU pair on digits" in lines["quick"] and "sync" in lines
    toml = hetbench(tmp_path, "suites", "quick")
    assert toml.returncode == 0 and 'name = "quick"' in toml.stdout
    copy = tmp_path / "copy.toml"
    copy.write_text(toml.stdout)
    from hetbench.harness.spec.suite import load_suite

    assert load_suite(str(copy)).runs == load_suite("quick").runs  # what it prints runs
    assert "quick, repartition" in " ".join(hetbench(tmp_path, "run", "--help").stdout.split())
    line = error_line(hetbench(tmp_path, "suites", "nope"))
    assert line.startswith("hetbench: error: suites: no built-in suite 'nope' (built-in: ci,")


def test_a_quick_study_overrides_repeats_steps_and_runs(tmp_path: Path, hetbench) -> None:
    out = tmp_path / "out"
    done = hetbench(tmp_path, "run", "quick", "-k", "homogeneous", "--steps", "12",
                    "--repeats", "2", "--out", str(out), "--no-progress", figures=True)
    assert done.returncode == 0, done.stderr
    runs = sorted((out / "quick").glob("homogeneous-r*"))
    assert [r.name.split("-")[1] for r in runs] == ["r0", "r1"]
    assert not list((out / "quick").glob("hetero*"))
    manifest = json.loads((runs[0] / "manifest.json").read_text())
    assert manifest["run"]["steps"] == 12 and manifest["rows"] == 2 * 12
    # the suite's figures are drawn at its end by default (the other tests say --no-figures)
    for name in ("compute_per_step", "phase_breakdown"):
        assert (out / "quick" / "figures" / f"{name}.png").is_file()
        assert (out / "quick" / "figures" / f"{name}.pdf").is_file()
    assert f"in {out / 'quick' / 'figures'}" in done.stdout


def test_no_figures_draws_none_and_says_how_to_draw_them(tmp_path: Path, write_suite,
                                                         hetbench) -> None:
    suite = write_suite('[suite]\nname = "bare"\n[[runs]]\nname = "r"\nsteps = 3\n')
    out = tmp_path / "out"
    done = hetbench(tmp_path, "run", str(suite), "--out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert not (out / "bare" / "figures").exists()
    command = f"hetbench figures {out / 'bare'} --out {out / 'bare' / 'figures'}"
    assert f"figures: none drawn (--no-figures; {command})" in done.stdout
    drawn = hetbench(tmp_path, *command.split()[1:])
    assert drawn.returncode == 0, drawn.stderr
    assert (out / "bare" / "figures" / "compute_per_step.png").is_file()


def test_an_oversubscribed_run_is_warned_recorded_and_flagged(tmp_path: Path,
                                                               write_suite, hetbench) -> None:
    cores = len(os.sched_getaffinity(0))
    suite = write_suite(f'[suite]\nname = "busy"\n[[runs]]\nname = "r"\nsteps = 6\n'
                        f'workers = [ {{ device = "cpu", threads = {cores + 1} }} ]\n')
    out = tmp_path / "out"
    done = hetbench(tmp_path, "run", str(suite), "--out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert f"warning: {cores + 1} worker threads computing on {cores + 1:g} of {cores} cores" \
        in done.stdout
    (run_dir,) = (out / "busy").glob("r-r0-*")
    load = json.loads((run_dir / "manifest.json").read_text())["load"]
    assert load["oversubscribed"] is True and load["cores"] == cores
    assert load["cpu_demand"] == cores + 1
    assert isinstance(load["load_average_1m"], float)
    report = hetbench(tmp_path, "report", str(out / "busy"), "--no-figures")
    assert report.returncode == 0, report.stderr
    text = (out / "busy" / "report" / "report.md").read_text()
    assert f"**Oversubscribed**: {cores + 1} worker threads computing on {cores + 1:g} of " \
        f"{cores} cores" in text


def test_slowed_cpu_workers_ask_the_cores_for_the_share_they_compute(write_suite) -> None:
    """A CPU worker slowed s times sleeps all but 1/s of its compute: 3 x cores of them at
    10x (3 at 4 threads, scheduled 20x then 10x) demand 0.3 x cores plus the rest; a GPU
    worker, whose host thread waits for it, and an unslowed one, all of their threads."""
    from hetbench.harness.records.rundir import core_load
    from hetbench.harness.spec.suite import load_suite

    cores = len(os.sched_getaffinity(0))
    slowed = ", ".join(['{ device = "cpu", slowdown = 10.0 }'] * (3 * cores))
    suite = write_suite(f'[suite]\nname = "s"\n[[runs]]\nname = "r"\nworkers = [ {slowed}, '
                        '{ device = "cpu", threads = 4, slowdown_at = [[0, 20.0], [5, 10.0]] } ]\n'
                        '[[runs]]\nname = "plain"\nworkers = [ { device = "cpu", threads = 2 }, '
                        '{ device = "cpu", threads = 3 } ]\n')
    slow, plain = (core_load(run) for run in load_suite(str(suite)).runs)
    assert slow["worker_threads"] == 3 * cores + 4
    assert slow["cpu_demand"] == pytest.approx(0.3 * cores + 0.4)
    assert slow["oversubscribed"] is False
    assert plain["cpu_demand"] == 5 and plain["oversubscribed"] is (5 > cores)


def test_launches_of_a_run_are_numbered_on_and_never_pooled_silently(tmp_path: Path,
                                                                      hetbench) -> None:
    out = tmp_path / "out"
    for runs in (["homogeneous"], ["homogeneous"], ["hetero-equal"]):
        done = hetbench(tmp_path, "run", "quick", *(f"-k{r}" for r in runs), "--steps", "12",
                        "--out", str(out), "--no-progress")
        assert done.returncode == 0, done.stderr
    manifests = [json.loads(p.read_text()) for p in
                 sorted((out / "quick").glob("homogeneous-r*/manifest.json"))]
    assert [m["repeat"] for m in manifests] == [0, 1]  # the second launch numbers on
    first, second = (m["launch"] for m in manifests)
    assert first != second
    # a run launched for the first time is its repeat 0, whatever else the folder holds
    (other,) = [json.loads(p.read_text()) for p in
                (out / "quick").glob("hetero-equal-r*/manifest.json")]
    assert other["repeat"] == 0
    third = other["launch"]

    def report(*extra: str) -> tuple[str, str]:
        done = hetbench(tmp_path, "report", str(out / "quick"), "--no-figures", *extra)
        assert done.returncode == 0, done.stderr
        return done.stderr, (out / "quick" / "report" / "report.md").read_text()

    err, text = report()
    assert (f"holds 3 launches ({first}, {second}, {third}) and homogeneous in more than "
            "one: reading each run's newest launch") in err
    # the other run's launch is read with the newest of the run launched twice
    assert "homogeneous-r1-" in text and "homogeneous-r0-" not in text
    assert "hetero-equal-r0-" in text
    err, text = report("--pool-launches")
    assert f"pooling 3 launches as repeats ({first}, {second}, {third})" in err
    assert "homogeneous-r1-" in text and "homogeneous-r0-" in text
    err, text = report("--launch", first)
    assert f"reading launch {first}" in err and "homogeneous-r1-" not in text
    line = error_line(hetbench(tmp_path, "report", str(out / "quick"), "--launch", "x*"))
    assert line.startswith("hetbench: error: --launch: 'x*' matches no launch of suite quick")


def test_suite_progress_says_which_run_of_how_many_and_the_time_left() -> None:
    from hetbench.harness.cli.progress import clock as _clock
    from hetbench.harness.cli.run import SuiteClock

    clock = SuiteClock()
    assert clock.started(3) == "run 1 of 3, 0:00 elapsed"
    clock.begin -= 30  # the first run took 30 s
    assert clock.started(3) == "run 2 of 3, 0:30 elapsed, about 1:00 left"  # runs 2 and 3
    assert (_clock(59.6), _clock(3725)) == ("1:00", "1:02:05")
