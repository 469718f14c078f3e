"""`hetbench report` and `hetbench figures` on run directories as hetbench writes them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from hetbench.harness.cli.main import main
from tests.conftest import Spawn
from tests.synthetic import steps_frame, write_run

FIGURES = ("compute_per_step", "idle_ecdf", "phase_breakdown", "straggler_causes", "what_if",
           "cv_by_group")


@pytest.fixture
def suite_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / "synthetic"
    for repeat in range(3):
        frame = steps_frame(40, lambda r, s, k=repeat: [2.0, 4.0 + 0.2 * k + (s % 7 == 0)][r])
        write_run(folder, frame, name="pair", repeat=repeat, slowdown=(1.0, 2.0),
                  standalone=[{"rank": 0, "samples_per_s": 16e3},
                              {"rank": 1, "samples_per_s": 8e3}])
    # A run that failed after 15 of its 40 steps.
    write_run(folder, steps_frame(15, lambda r, s: 2.0), name="broken", status="failed",
              planned_steps=40)
    return folder


def test_report_writes_markdown_and_figures(suite_folder: Path, capsys) -> None:
    assert main(["report", str(suite_folder)]) == 0
    out = capsys.readouterr().out
    # The headline first, then tables that fit 100 columns
    assert out.startswith("4 run(s): 2 configuration(s) x 1-3 repeat(s).\n")
    assert "Not completed (1): broken-r0 failed." in out
    summary = out.split("\nreport: ")[0]  # then the files' paths, as long as they are
    assert max(len(line) for line in summary.splitlines()) <= 100
    report_dir = suite_folder / "report"
    text = (report_dir / "report.md").read_text()
    assert "- pair: variability costs" in text and "over 3 repeats" in text
    assert "| step | worker 0 | worker 1 |" in text
    assert "| broken-r0 | failed | True |" in text  # partial runs are reported, and marked
    assert "Straggler excess" in text and "What-if" in text
    for name in FIGURES:
        assert (report_dir / f"{name}.png").stat().st_size > 1000
        assert f"![{name}.png]({name}.png)" in text


def test_report_compares_aggregation_strategies(tmp_path: Path, capsys) -> None:
    """Runs with a native strategy get a table of communication time per strategy:
    median and p95 of reduced - arrival, idle excluded."""
    folder = tmp_path / "strategies"
    for repeat in range(2):
        for strategy, comm_ms in (("torch", 0.5), ("mxnet-kvstore", 2.0)):
            frame = steps_frame(30, lambda r, s: [2.0, 3.0][r], comm_ms=comm_ms)
            write_run(folder, frame, name=strategy, repeat=repeat, strategy=strategy)
    assert main(["report", str(folder), "--no-figures"]) == 0
    text = (folder / "report" / "report.md").read_text()
    section = text.split("## Communication by aggregator")[1].split("##")[0]
    rows = {line.split("|")[2].strip(): line for line in section.splitlines()
            if line.startswith("| pytorch")}
    assert set(rows) == {"torch", "mxnet-kvstore"}
    cells = {name: [c.strip() for c in line.split("|")] for name, line in rows.items()}
    assert cells["torch"][3] == "2" and cells["mxnet-kvstore"][3] == "2"  # repeats
    assert "0.5" in cells["torch"][4:6] and "2" in cells["mxnet-kvstore"][4:6]
    # the variability of the setups side by side: one column per aggregation strategy
    setups = text.split("## By framework, aggregation")[1].split("##")[0]
    header = next(line for line in setups.splitlines() if line.startswith("| metric"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["metric", "mxnet-kvstore",
                                                                 "torch"]
    idle = next(line for line in setups.splitlines() if line.startswith("| idle_fraction"))
    assert idle.count("[") == 2  # mean [95% interval] for each


def test_figures_command_writes_png_and_pdf(suite_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "figs"
    assert main(["figures", str(suite_folder / "pair-r0"), "--out", str(out)]) == 0
    for name in FIGURES:
        assert (out / f"{name}.png").is_file() and (out / f"{name}.pdf").is_file()
        pdf = (out / f"{name}.pdf").read_bytes()
        # fonts embedded as TrueType, not Type 3 (journals' submission checks refuse those)
        assert b"/Type3" not in pdf
        assert b"/CIDFontType2" in pdf or b"/TrueType" in pdf


def test_a_folder_without_runs_is_one_clear_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a run directory" in err


def test_an_unknown_schema_is_refused(suite_folder: Path, capsys) -> None:
    path = suite_folder / "pair-r0" / "manifest.json"
    meta = json.loads(path.read_text())
    meta["schema_version"] = 99
    path.write_text(json.dumps(meta))
    assert main(["report", str(suite_folder / "pair-r0")]) == 2
    err = capsys.readouterr().err.strip()
    assert "schema_version 99 is not supported" in err and err.count("\n") == 0


def test_paper_writes_every_figure_and_the_study_table(suite_folder: Path, tmp_path: Path,
                                                       capsys) -> None:
    import numpy as np
    from scipy import stats

    from hetbench.analysis.view.metrics import run_summary
    from hetbench.harness.records.results import load_run

    out = tmp_path / "paper"
    assert main(["paper", str(suite_folder), "--out", str(out)]) == 0
    for name in (*FIGURES, "step_timeline", "batch_times", "heatmap"):
        assert (out / f"{name}.png").is_file() and (out / f"{name}.pdf").is_file()
    lines = (out / "table.md").read_text().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["run", "devices", "repeats", "samples/s"]
    assert "het. efficiency" in header  # the runs recorded standalone rates
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]
            if line.startswith("|")]
    assert [r[0] for r in rows] == ["pair"]  # the failed run is not a configuration
    assert rows[0][2] == "3"
    # samples/s: mean and 95% t half-interval over the three repeats
    values = np.array([run_summary(load_run(suite_folder / f"pair-r{k}").steps)["samples_per_s"]
                       for k in range(3)])
    half = stats.t.ppf(0.975, 2) * values.std(ddof=1) / np.sqrt(3)
    mean_text, half_text = rows[0][3].split(" ± ")
    assert float(mean_text) == pytest.approx(values.mean(), abs=0.5)
    assert float(half_text) == pytest.approx(half, rel=0.05)
    tex = (out / "table.tex").read_text()
    assert r"\begin{tabular}{llrrr" in tex and r"$\pm$" in tex and r"\toprule" in tex
    assert "het. efficiency: samples/s over the sum" in tex


CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)
# Added to a copy of the page before the test opens it: what loaded, and any error
CHECK = """<script>
const errors = [];
window.addEventListener("error", e => errors.push(String(e.message || e.target.src)), true);
window.addEventListener("load", () => {
  const images = [...document.images];
  const shown = images.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.check = `images=${images.length} shown=${shown} errors=${errors.length}`;
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium here (Debian: apt-get "
                    "install chromium; .ci/run installs it)")
def test_the_html_report_stands_alone_loads_without_errors_and_shows_every_figure(
        suite_folder: Path, tmp_path: Path, capsys, spawn: Spawn) -> None:
    out = tmp_path / "report"
    assert main(["report", str(suite_folder), "--out", str(out), "--html"]) == 0
    text = (out / "report.html").read_text()
    figures = sorted(p.name for p in out.glob("*.png") if p.stem != "regression_history")
    assert len(figures) >= len(FIGURES)
    # self-contained: every image inline, nothing fetched, no script of its own
    sources = re.findall(r'<img src="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<script" not in text and "<link" not in text
    for section in ("Configuration", "Environment", "Regression history", "Straggler"):
        assert section in text
    page = tmp_path / "checked.html"
    page.write_text(text.replace("</head>", CHECK + "</head>", 1))
    done = spawn.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                      "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                     capture_output=True, text=True, timeout=120)
    found = re.search(r'data-check="images=(\d+) shown=(\d+) errors=(\d+)"', done.stdout)
    assert found, done.stderr[-2000:]
    images, shown, errors = map(int, found.groups())
    # every figure of the folder, and the history's where there are committed baselines
    assert images == shown >= len(figures) and errors == 0, (images, shown, errors)


def test_the_regression_history_reads_each_commit_of_the_baselines(tmp_path: Path,
                                                                   spawn: Spawn) -> None:
    """A git repository whose baselines changed twice (a 2 ms, then a 4 ms compute step)
    and once elsewhere: two snapshots, oldest first, each with its own runs."""
    from hetbench.analysis.render.html_report import history_table
    from hetbench.harness.records import baselines
    from hetbench.harness.records.results import find_runs, load_run

    repo = tmp_path / "repo"
    folder = repo / baselines.BASELINE_DIR

    def git(*args: str) -> str:
        return spawn.run(["git", "-C", str(repo), "-c", "user.name=t", "-c",
                          "user.email=t@t", *args], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()

    repo.mkdir()
    git("init", "-q")
    commits = []
    for compute in (2.0, 4.0):
        shutil.rmtree(folder, ignore_errors=True)
        for repeat in range(3):
            write_run(folder, steps_frame(12, lambda r, s, c=compute: c), name="pair",
                      repeat=repeat)
        git("add", "-A")
        git("commit", "-q", "-m", f"baselines at {compute} ms")
        commits.append(git("rev-parse", "HEAD"))
    (repo / "other.txt").write_text("not a baseline")
    git("add", "-A")
    git("commit", "-q", "-m", "elsewhere")
    with baselines.snapshots(repo) as found:
        assert [s.commit for s in found] == commits
        assert [s.subject for s in found] == ["baselines at 2.0 ms", "baselines at 4.0 ms"]
        points = [(s.commit, s.date, s.subject, list(map(load_run, find_runs([s.folder]))))
                  for s in found]
        extracted = found[0].folder
    assert not extracted.exists()  # the extracted copies are gone after use
    history = history_table(points)
    assert list(history["runs"]) == [3, 3]
    # a step: compute, 0.5 ms of communication, 0.1 ms of update (tests/synthetic.py)
    assert list(history["mean_step_ms"]) == pytest.approx([2.6, 4.6], abs=0.01)
    with baselines.snapshots(tmp_path) as none:  # not a repository: no history, no error
        assert none == []


@pytest.mark.parametrize("has_data_filter", [True, False])
def test_baseline_snapshots_extract_plain_files_only(tmp_path: Path, has_data_filter: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With tarfile's "data" filter (Python 3.11.4+) and without it (older 3.11 releases),
    a snapshot's files are extracted and a member leaving the folder is refused."""
    import io
    import tarfile

    from hetbench.harness.records.baselines import _extract

    if not has_data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)

    def archive(*names: str) -> tarfile.TarFile:
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as out:
            for name in names:
                info = tarfile.TarInfo(name)
                info.size = 2
                out.addfile(info, io.BytesIO(b"{}"))
        data.seek(0)
        return tarfile.open(fileobj=data)

    _extract(archive("results/baselines/ci/manifest.json"), tmp_path / "ok")
    assert (tmp_path / "ok" / "results/baselines/ci/manifest.json").read_text() == "{}"
    with pytest.raises(tarfile.TarError):
        _extract(archive("../outside.json"), tmp_path / "bad")
    assert not (tmp_path / "outside.json").exists()


def test_at_a_terminal_report_says_each_stage_as_it_begins(suite_folder: Path, capsys,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A person at a terminal sees the runs read, each group of figures and the tables,
    with the time elapsed; piped, stderr holds none of it (tests above: one error line)."""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["report", str(suite_folder), "--out", str(suite_folder / "r")]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "elapsed]" in line]
    stages = [re.sub(r"^ +\[[\d:]+ elapsed\] ", "", line) for line in said]
    assert stages[0] == "report: 4 runs read" and stages[-1] == "report: tables", said
    # each group of figures as it is done: drawn side by side, in whichever order they end
    figures = [s for s in stages if s.startswith("report: figures ")]
    assert [s.split(" done: ")[0] for s in figures] == [
        f"report: figures {k} of 12" for k in range(1, 13)], figures
    assert sorted(s.split(" done: ")[1] for s in figures) == sorted(
        ("compute and idle per step", "phases", "straggler causes", "what-if", "slices",
         "compute CV over repeats", "convergence", "schemes", "pipeline", "step timeline",
         "slices of a step", "heatmap"))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert main(["report", str(suite_folder), "--no-figures",
                 "--out", str(suite_folder / "r2")]) == 0
    assert "elapsed]" not in capsys.readouterr().err
