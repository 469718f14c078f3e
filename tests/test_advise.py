"""`hetbench advise`: the remedies of a recorded job (only those the suite loader accepts,
the others refused with its reason), their predictions against a job whose truth is known,
bad input refused up front, and --verify end to end on a tiny real job."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from hetbench.analysis.advice import advisor
from hetbench.analysis.advice.advice_report import resolved_tau
from hetbench.analysis.models import deviceclass
from hetbench.analysis.models.pipeline_model import LayerShape
from hetbench.analysis.models.simulate import Scheme, parse_scheme
from hetbench.harness.cli.advise import layer_shape, tensor_sizes
from hetbench.harness.cli.main import main
from hetbench.harness.records import collector, manifest
from hetbench.harness.spec.suite import _parse_toml, load_suite, parse_suite
from tests.synthetic import steps_frame
from tests.test_simulate import PARAMETERS

TIMEOUT_S = 300

# three CPU workers, equal slices of 96: worker 0 computes 0.3 ms per sample (emulated 3x
# slower), workers 1 and 2 0.1 ms; the exchange takes 0.5 ms after the last arrival
PER_SAMPLE_MS = (0.3, 0.1, 0.1)
SLICE = 32
JOB = """[suite]
name = "synthetic"
[[runs]]
name = "trio"
workload = "mlp"
steps = 60
warmup_steps = 4
global_batch = 96
workers = [ { device = "cpu", slowdown = 3.0 }, { device = "cpu" }, { device = "cpu" } ]
"""


def spec(text: str = JOB) -> Any:
    return parse_suite(_parse_toml(text, "test"), "test").runs[0]


def write_job(folder: Path, text: str = JOB, status: str = "completed",
              name: str = "trio-r0-x", slices: tuple[int, ...] = (SLICE,) * 3,
              fixed_ms: float = 0.0) -> Path:
    """A run directory of the job above with records built by hand: worker r computes
    (fixed_ms + PER_SAMPLE_MS[r] x its slice) x its slowdown (3 for worker 0, which
    PER_SAMPLE_MS holds already), the known truth."""
    run = spec(text)
    slowdown = [3.0, 1.0, 1.0]
    frame = steps_frame(run.steps, lambda r, s: fixed_ms * slowdown[r] + PER_SAMPLE_MS[r]
                        * slices[r], world=3, batch=lambda r: slices[r])
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    meta = manifest.new({"name": "synthetic"}, run.to_dict(), 0, name, {"host": "test"},
                        "emulated")
    labels = ["pytorch cpu x1 slowdown 3", "pytorch cpu x1", "pytorch cpu x1"]
    meta.update(status=status, workers=[{"rank": r, "label": labels[r],
                                         "parameters": PARAMETERS} for r in range(3)])
    manifest.write(run_dir, meta)
    collector.write_steps(run_dir, frame)
    return run_dir


def predictions(run_dir: Path, cores: int | None = None) -> pd.DataFrame:
    """The advisor's ranking of the job's remedies (2 simulated repeats), the job's host
    having `cores` (None: contention not modelled)."""
    from hetbench.harness.records.results import load_run

    data = load_run(run_dir)
    runs = [data]
    classes, names = deviceclass.fit_classes(runs)
    comm = deviceclass.fit_comm(runs)
    by_rank = [classes[names[f"rank{r}"]] for r in range(3)]
    text, sizes = deviceclass.recorded_scheme(data)
    recorded = spec()
    found, _ = advisor.remedies(recorded, parse_scheme(text), sizes,
                                [c.name for c in by_rank])
    steps = recorded.steps - recorded.warmup_steps
    host = advisor.Host(cores, (1, 1, 1), (SLICE,) * 3)
    return advisor.rank([advisor.predict(
        r, advisor.remedy_workers(r, by_rank, host, recorded.global_batch), comm, steps,
        recorded.global_batch, 2) for r in found], None)


def test_every_remedy_the_job_can_run_and_only_once() -> None:
    found, refused = advisor.remedies(spec(), Scheme("bsp"), (32, 32, 32), ["a", "b", "c"])
    names = [r.name for r in found]
    assert len(names) == len(set(names))
    # the recorded job's own policy (equal) is not proposed again
    assert names[0] == "recorded" and "partition-equal" not in names
    assert {"partition-profiled", "partition-model"} <= set(names)
    # every proper subset of three workers: six leave-outs
    assert sorted(n for n in names if n.startswith("leave-out")) == sorted(
        ["leave-out-0", "leave-out-1", "leave-out-2", "leave-out-0-1", "leave-out-0-2",
         "leave-out-1-2"])
    assert {"ps-sync", "ps-async", "ssp1", "ssp2", "ssp4", "backup1", "backup2",
            "local-sgd2", "local-sgd4", "local-sgd8"} <= set(names)
    kept = next(r for r in found if r.name == "leave-out-0")
    assert kept.ranks == (1, 2) and len(kept.run.workers) == 2
    assert kept.run.global_batch == 96  # the whole batch, shared by those kept
    # no layer profile and no tensors given: the pipelines and placements refused with the
    # reason (the MLP has no fully connected tail for fc-on-server either)
    assert {r.label: r.reason for r in refused} == {
        advisor.PIPELINES: "no layer profile", advisor.PLACEMENTS:
        "the model's parameter tensors are not known", advisor.FC_ON_SERVER:
        "'mlp' has no fully connected tail to place on a server"}


def test_placements_are_proposed_with_their_busiest_servers_share() -> None:
    """Two servers, the tensors sharded (the cut that makes the largest shard smallest:
    100 + 10 + 1000 against 10 + 500 + 5) and dealt round-robin (tensors 0, 2 and 4 on
    one server: 100 + 1000 + 500 of 1,625 elements)."""
    tensors = (100, 10, 1000, 10, 500, 5)
    found, refused = advisor.remedies(spec(), Scheme("bsp"), None, ["a", "b", "c"],
                                      tensors=tensors)
    placed = {r.name: r for r in found if r.kind == "placement"}
    assert sorted(placed) == ["ps-sync-2-data-parallel", "ps-sync-2-sharded"]
    assert placed["ps-sync-2-sharded"].busiest == pytest.approx(1110 / 1625)
    assert placed["ps-sync-2-data-parallel"].busiest == pytest.approx(1600 / 1625)
    for remedy in placed.values():
        assert remedy.exact and remedy.servers == 2 and remedy.run.aggregator.servers == 2
        assert advisor.why_not(remedy.run) == ""  # the suite loader takes it as written
    assert advisor.PLACEMENTS not in {r.label for r in refused}
    # a model of one tensor cannot be placed on two servers
    _, refused = advisor.remedies(spec(), Scheme("bsp"), None, ["a", "b", "c"], tensors=(9,))
    assert (advisor.PLACEMENTS, "1 parameter tensor(s): too few to place on 2 servers") in {
        (r.label, r.reason) for r in refused}
    # a job on three servers is placed on three; its own placement is not proposed again
    three = JOB.replace('name = "trio"', 'name = "trio"\naggregator = { name = "ps-sync", '
                        'servers = 3 }\nplacement = "data-parallel"')
    found, _ = advisor.remedies(spec(three), Scheme("bsp"), None, ["a", "b", "c"],
                                tensors=tensors)
    assert [r.name for r in found if r.kind == "placement"] == ["ps-sync-3-sharded"]


def test_fc_on_server_takes_the_tail_from_the_layers() -> None:
    """The CNN's last layer is its fully connected tail (workloads/cnn): with the layers
    of LAYERS (below), the two before it take 0.3 + 0.5 of the time, a third of it
    forward; 1,024 bytes a sample enter the tail, which holds 1e4 of the 3.1e5 bytes."""
    cnn = JOB.replace('workload = "mlp"', 'workload = "cnn"')
    found, refused = advisor.remedies(spec(cnn), Scheme("bsp"), None, ["a", "b", "c"], LAYERS)
    tailed = next(r for r in found if r.name == "ps-sync-2-fc-on-server")
    assert tailed.kind == "fc-on-server" and tailed.exact and tailed.servers == 2
    assert dataclasses.astuple(tailed.tail) == pytest.approx((0.8 / 3, 0.8 * 2 / 3, 1024.0,
                                                              1 / 31))
    assert advisor.why_not(tailed.run) == ""  # the suite loader takes it as written
    assert advisor.FC_ON_SERVER not in {r.label for r in refused}
    # without the layers timed, why
    _, refused = advisor.remedies(spec(cnn), Scheme("bsp"), None, ["a", "b", "c"],
                                  "'cnn' on tensorflow: no layers")
    assert (advisor.FC_ON_SERVER, "'cnn' on tensorflow: no layers") in {
        (r.label, r.reason) for r in refused}


# four workers, 1 and 3 fast, 0 and 2 emulated 3x slower; the MLP's 3 layers
FOUR = JOB.replace('global_batch = 96', 'global_batch = 128').replace(
    'workers = [ { device = "cpu", slowdown = 3.0 }, { device = "cpu" }, { device = "cpu" } ]',
    'workers = [ { device = "cpu", slowdown = 3.0 }, { device = "cpu" }, '
    '{ device = "cpu", slowdown = 3.0 }, { device = "cpu" } ]')
LAYERS = LayerShape((0.3, 0.5, 0.2), (1024.0, 1024.0, 40.0), (1e5, 2e5, 1e4))


def test_pipelines_are_proposed_where_the_layers_allow_and_run_as_suites() -> None:
    found, refused = advisor.remedies(spec(FOUR), Scheme("bsp"), None, ["s", "f", "s", "f"],
                                      LAYERS)
    pipes = {r.name: r for r in found if r.kind == "pipeline"}
    # virtual workers of 2 (4 stages exceed the 3 layers), each allocation, D = 0 and 2
    assert sorted(pipes) == ["pipe-same-kind2-d0", "pipe-same-kind2-d2", "pipe-spread2-d0",
                             "pipe-spread2-d2"]
    assert advisor.PIPELINES not in {r.label for r in refused}
    # fastest first within each: a fast and a slow worker each, or two of a kind
    assert pipes["pipe-spread2-d0"].pipeline.groups == ((1, 0), (3, 2))
    assert pipes["pipe-same-kind2-d2"].pipeline.groups == ((1, 3), (0, 2))
    assert pipes["pipe-spread2-d0"].exact and not pipes["pipe-spread2-d2"].exact
    for remedy in pipes.values():
        run = remedy.run
        assert run.pipeline.micro_batches == 4  # slices of 64
        assert run.aggregator.name == ("wsp" if run.pipeline.wave_bound else "torch")
        assert advisor.why_not(run) == ""  # the suite loader takes it as it is written
    _, refused = advisor.remedies(spec(FOUR), Scheme("bsp"), None, ["s", "f", "s", "f"],
                                  "'lstm' has no layer sequence to pipeline")
    assert (advisor.PIPELINES, "'lstm' has no layer sequence to pipeline") in {
        (r.label, r.reason) for r in refused}


def test_partitions_and_leave_outs_keep_the_jobs_exchange() -> None:
    ddp = JOB.replace('name = "trio"', 'name = "trio"\naggregator = "ddp"')
    found, _ = advisor.remedies(spec(ddp), Scheme("bsp"), None, ["a", "b", "c"])
    by_name = {r.name: r.run.aggregator.name for r in found}
    assert by_name["partition-profiled"] == by_name["leave-out-0"] == "ddp"
    assert "partition-equal" not in by_name  # the job itself
    assert by_name["ssp2"] == "ssp"


def test_a_jobs_remedies_take_the_parameter_servers_and_its_recorded_tensors() -> None:
    """A job named by import path runs on the parameter servers; its placements cut the
    tensors its manifest recorded (none recorded: refused with why), and what needs its
    layers is refused with why."""
    job = spec(JOB.replace('workload = "mlp"', 'workload = "mine.models:make"'))
    assert tensor_sizes(job, {"job": {"tensors": [120, 8, 40, 4]}}) == (120, 8, 40, 4)
    assert tensor_sizes(job, {"job": {"parameters": 172}}) is None  # recorded before
    found, refused = advisor.remedies(job, Scheme("bsp"), None, ["a", "b", "c"],
                                      layer_shape(job), (120, 8, 40, 4))
    names = {r.name for r in found}
    assert {"ps-sync", "ps-async", "ssp2", "backup1", "ps-sync-2-sharded"} <= names
    reasons = {r.label: r.reason for r in refused}
    # the job's layers are timed where the job check makes it: here there is none
    for needs_layers in (advisor.PIPELINES, advisor.FC_ON_SERVER):
        assert reasons[needs_layers].startswith("the job could not be made to time its layers")
    _, refused = advisor.remedies(job, Scheme("bsp"), None, ["a", "b", "c"], "none", None)
    assert (advisor.PLACEMENTS, "the model's parameter tensors are not known") in {
        (r.label, r.reason) for r in refused}


def test_remedies_the_loader_refuses_are_listed_with_its_reason() -> None:
    survives = JOB.replace('name = "trio"', 'name = "trio"\naggregator = "ps-async"\n'
                           'on_worker_failure = "continue"')
    found, refused = advisor.remedies(spec(survives), Scheme("ps-async"), None,
                                      ["a", "b", "c"])
    assert [r.name for r in found] == ["recorded"]
    reasons = {r.label: r.reason for r in refused}
    assert reasons["ssp:2"].startswith("on_worker_failure: 'continue' needs aggregator "
                                       "'ps-async'")
    assert "not 'torch'" in reasons["leave out worker 0 (a)"]
    alone = JOB.replace('workers = [ { device = "cpu", slowdown = 3.0 }, { device = "cpu" }, '
                        '{ device = "cpu" } ]', 'workers = [ { device = "cpu" } ]')
    _, refused = advisor.remedies(spec(alone), Scheme("bsp"), None, ["a"])
    assert ("leave a device out", "one worker: none to leave out") in {
        (r.label, r.reason) for r in refused}


def test_predictions_match_the_known_job(tmp_path: Path) -> None:
    ranked = predictions(write_job(tmp_path)).set_index("remedy")
    comm_ms, after_ms = 0.5, 0.1 + 0.01  # tests/synthetic.py: update, then 10 us to the next
    recorded = PER_SAMPLE_MS[0] * SLICE + comm_ms + after_ms
    assert ranked.loc["recorded", "mean_step_ms"] == pytest.approx(recorded, rel=0.03)
    # without the slow worker, 48 samples each at 0.1 ms; the exchange of two: one point
    # fitted (three workers, 0.5 ms), split as the ring's 2(N-1) latencies
    alone = 48 * 0.1 + comm_ms * 2 / 4 + after_ms
    assert ranked.loc["leave-out-0", "mean_step_ms"] == pytest.approx(alone, rel=0.05)
    # slices in proportion to speed (1 : 3 : 3 of 96) finish together: the best
    profiled = 96 / 7 * PER_SAMPLE_MS[0] + comm_ms + after_ms
    assert ranked.loc["partition-profiled", "mean_step_ms"] == pytest.approx(profiled, rel=0.1)
    order = list(ranked.index)
    assert order.index("partition-profiled") < order.index("leave-out-0") < \
        order.index("recorded") < order.index("leave-out-1")
    # ps-async: each worker pushes its 32 samples every compute + round trip (two
    # latencies; the servers' service time is nil, as the fitted exchange is all latency)
    cycle = [PER_SAMPLE_MS[r] * SLICE + comm_ms + after_ms for r in range(3)]
    rate = sum(SLICE / c for c in cycle)  # samples per ms
    steps = spec().steps - spec().warmup_steps
    assert ranked.loc["ps-async", "seconds"] == pytest.approx(steps * 96 / rate / 1e3, rel=0.05)
    # ps-sync: every step waits for the slow worker's push, as the all-reduce did
    assert ranked.loc["ps-sync", "mean_step_ms"] == pytest.approx(recorded, rel=0.03)
    assert ranked.loc["recorded", "vs_recorded"] == 0
    assert ranked["rank"].tolist() == list(range(1, len(ranked) + 1))
    sentence = advisor.explain(ranked.loc["leave-out-0"].rename("leave-out-0"),
                               ranked.loc["recorded"])
    assert sentence.startswith("leave out worker 0 (cpu-3x): ")
    assert "idle before the exchange -" in sentence


def test_leaving_a_worker_out_gives_the_others_their_cores_back(tmp_path: Path) -> None:
    ranked = predictions(write_job(tmp_path), cores=2).set_index("remedy")
    comm_ms, after_ms = 0.5, 0.1 + 0.01
    # recorded: three threads computing on two cores (the slow worker's real part is 3.2 ms
    # too: it sleeps the rest), so each at 2/3 speed: 0.1 ms per sample is 1/15 alone
    assert ranked.loc["recorded", "mean_step_ms"] == pytest.approx(
        PER_SAMPLE_MS[0] * SLICE + comm_ms + after_ms, rel=0.03)
    alone = 48 * 0.1 / 1.5 + comm_ms * 2 / 4 + after_ms  # two threads: no wait
    assert ranked.loc["leave-out-0", "mean_step_ms"] == pytest.approx(alone, rel=0.05)


def test_runs_of_the_same_workers_under_other_slices_fit_the_intercept(tmp_path: Path,
                                                                       capsys) -> None:  # type: ignore[no-untyped-def]
    # compute 1 ms + 0.1 ms per sample (x3 for worker 0); the job's equal slices alone
    # leave the line through the origin (1/32 + 0.1 ms per sample: 48 samples 3.9 ms)
    job = write_job(tmp_path / "in", fixed_ms=1.0)
    sized = JOB.replace('name = "trio"', 'name = "trio-sized"\n'
                        'partition = { policy = "sizes", sizes = [16, 40, 40] }')
    write_job(tmp_path / "in", sized, name="trio-sized-r0-x", slices=(16, 40, 40),
              fixed_ms=1.0)
    out = tmp_path / "advice"
    assert main(["advise", str(job.parent), "--job", "trio", "--repeats", "2", "--out",
                 str(out)]) == 0
    table = pd.read_csv(out / "advice.csv").set_index("remedy")
    truth = 1.0 + 48 * 0.1 + 0.5 * 2 / 4 + 0.11  # worker 0 left out: 48 samples each
    assert table.loc["leave-out-0", "mean_step_ms"] == pytest.approx(truth, rel=0.05)
    assert "and 1 of the same workers and exchange (trio-sized)" in (
        out / "advice.md").read_text()


def test_the_advice_and_its_suite(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    run_dir = write_job(tmp_path / "in")
    out = tmp_path / "advice"
    assert main(["advise", str(run_dir), "--top", "2", "--repeats", "2", "--out",
                 str(out)]) == 0
    shown = capsys.readouterr().out
    table = pd.read_csv(out / "advice.csv")
    assert table["label"].iloc[0] in shown.splitlines()[1]  # the best first
    suite = load_suite(str(out / "advised.toml"))
    assert [r.name for r in suite.runs][0] == "recorded" and len(suite.runs) == 3
    assert suite.runs[1].name == table[table["kind"] != "recorded"]["remedy"].iloc[0]
    assert suite.runs[0].workers == spec().workers
    advice = (out / "advice.md").read_text()
    assert "## Top remedies" in advice and "placement fc-on-server" in advice
    assert (out / "figures" / "advice.png").is_file()
    # the MLP's tensors placed on two servers, each placement predicted
    placed = table[table["kind"] == "placement"].set_index("remedy")
    assert sorted(placed.index) == ["ps-sync-2-data-parallel", "ps-sync-2-sharded"]
    assert placed["exact"].all() and (placed["seconds"] > 0).all()
    # the MLP's layers profiled here: one virtual worker of the three, predicted
    pipe = table.set_index("remedy").loc["pipe-spread3-d0"]
    assert pipe["kind"] == "pipeline" and pipe["scheme"] == "pipeline" and pipe["exact"]
    assert math.isfinite(pipe["seconds"]) and pipe["seconds"] > 0
    # ... but, its model not yet validated, ranked after every other and never advised
    assert not pipe["advised"] and pipe["rank"] > table[table["advised"]]["rank"].max()
    assert "pipe-spread3-d0" not in [r.name for r in suite.runs]
    assert "- pipeline remedies: predicted op by op" in advice


def test_the_layers_are_timed_here_with_each_ones_forward() -> None:
    shape = layer_shape(spec())
    assert shape.layers == 3 and sum(shape.fractions) == pytest.approx(1.0)
    assert all(0 < f < 1 for f in shape.forward)  # each layer's forward, measured
    assert shape.activation_bytes[-1] == 10 * 4  # the MLP's 10 logits, float32, a sample


def write_other_workload(folder: Path) -> Path:
    return write_job(folder, JOB.replace('workload = "mlp"', 'workload = "cnn"'),
                     name="cnn-r0-x")


@pytest.mark.parametrize(("make", "arguments", "says"), [
    (lambda d: [write_job(d), write_other_workload(d)], [],
     "RESULTS: runs of more than one workload (cnn-digits, mlp-digits)"),
    (lambda d: [write_job(d, status="failed")], [],
     "RESULTS: no run can be fitted (trio: status failed: only completed runs"),
    (lambda d: [write_job(d)], ["--target", "0.9"],
     "--target: the recorded runs of 'trio' never evaluated 'accuracy'"),
    (lambda d: [write_job(d)], ["--target", "loss=x"], "--target: 'loss=x' is not"),
    (lambda d: [write_job(d)], ["--top", "0"], "--top: 0 is outside 1..20"),
    (lambda d: [write_job(d)], ["--job", "bsp"],
     "--job: no run that can be fitted matches 'bsp' (those that can: trio)"),
])
def test_bad_input_is_one_line_and_nothing_written(tmp_path: Path, capsys, make: Any,  # type: ignore[no-untyped-def]
                                                   arguments: list[str], says: str) -> None:
    runs = make(tmp_path / "in")
    out = tmp_path / "advice"
    status = main(["advise", *map(str, runs), *arguments, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith(f"hetbench: error: {says}"), err
    assert not out.exists()


TINY = """[suite]
name = "tiny"
[[runs]]
name = "pair"
workload = "mlp"
steps = 24
warmup_steps = 4
global_batch = 64
eval_every = 10
target = { value = 0.3 }  # held-out accuracy 0.12 after 10 steps, 0.44 after 20
workers = [ { device = "cpu", slowdown = 4.0 }, { device = "cpu" } ]
"""


def test_verify_runs_the_advised_suite(tmp_path: Path, hetbench) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "tiny.toml").write_text(TINY)
    recorded = hetbench(tmp_path, "run", "tiny.toml", "--out", "rec", "--no-progress")
    assert recorded.returncode == 0, recorded.stderr
    result = hetbench(tmp_path, "advise", "rec/tiny", "--top", "2", "--repeats", "2",
                      "--verify", "--no-figures", "--out", "adv")
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(tmp_path / "adv" / "advice.csv")
    verified = table.dropna(subset=["measured_s"])
    # the recorded job and the two best remedies, each run and measured
    assert len(verified) == 3 and "recorded" in set(verified["remedy"])
    runs = sorted(p.name.split("-r0-")[0] for p in (tmp_path / "adv" / "advised").glob("*-r0-*"))
    # --no-figures: the advised suite's runs drew none; advice's own figure is there
    assert not list((tmp_path / "adv" / "advised").glob("figures/*.png"))
    assert (tmp_path / "adv" / "figures" / "advice.png").is_file()
    assert runs == sorted(verified["remedy"])
    advice = (tmp_path / "adv" / "advice.md").read_text()
    line = next(x for x in advice.splitlines() if x.startswith("3 remedies run"))
    assert "compared on time to target" in line and "Kendall's tau" in line
    assert "whose repeats do not overlap" in line or "no pair of remedies" in line
    assert "reached by the recorded job in 20 steps" in advice
    assert ("was the fastest measured" in line) != ("was wrong" in line)
    assert line in result.stdout
    regret = advisor_regret(line)
    assert regret >= 0 and math.isfinite(regret)


def advisor_regret(line: str) -> float:
    """The regret a verdict line states, as a fraction."""
    return float(line.rsplit("(regret ", 1)[1].split("%")[0]) / 100


def test_the_ranking_is_scored_on_the_pairs_the_repeats_order() -> None:
    """Four remedies measured over repeats: a and b overlap (their order is noise), c and
    d are apart from both and from each other. A prediction that swaps a and b still
    agrees on every ordered pair; one that swaps c and d disagrees on one of five."""
    low, high = [1.0, 1.1, 2.0, 3.0], [1.2, 1.3, 2.2, 3.5]  # a, b, c, d
    assert resolved_tau([1.2, 1.0, 2.1, 3.2], low, high) == (1.0, 5)
    tau, pairs = resolved_tau([1.0, 1.1, 3.2, 2.1], low, high)
    assert pairs == 5 and tau == pytest.approx((4 - 1) / 5)
    # reversed everywhere: -1; a remedy with no prediction takes its pairs out
    assert resolved_tau([4.0, 3.0, 2.0, 1.0], low, high) == (-1.0, 5)
    assert resolved_tau([1.0, 1.1, float("nan"), 3.2], low, high) == (1.0, 2)
    # one repeat each (no range: -inf, inf) orders nothing
    inf = math.inf
    tau, pairs = resolved_tau([1.0, 2.0], [-inf, -inf], [inf, inf])
    assert pairs == 0 and math.isnan(tau)
