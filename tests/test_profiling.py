"""Issue 31, part 1: a run's `profile` window records torch.profiler traces, one per profiled
rank in the layout Holistic Trace Analysis reads; HTA's own reader loads them, and what it
reads of each step is checked against hetbench's records of the same steps. The profiled
steps (and the one after) are marked in steps.parquet and left out of the summaries."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from hetbench.analysis.view.metrics import run_summary
from hetbench.harness.loop.engine import Turn, run_steps
from hetbench.harness.loop.profiling import PROFILE_DIR, StepProfiler
from hetbench.harness.records.results import load_run
from hetbench.harness.spec.profiling import ProfileSpec
from tests.conftest import completed_runs

pytestmark = pytest.mark.slow

STEPS, WARMUP, FIRST, LAST = 24, 2, 8, 11
SUITE = f"""
[defaults]
framework = "pytorch"
workload = "mlp"
dataset = "digits"
steps = {STEPS}
warmup_steps = {WARMUP}
global_batch = 64
profile = {{ steps = "{FIRST}-{LAST}" }}

[[runs]]
name = "pair"
workers = [ {{ device = "cpu", threads = 1 }}, {{ device = "cpu", threads = 1, slowdown = 2.0 }} ]

[[runs]]
name = "pipeline"
virtual_workers = [[0, 1]]
pipeline = {{ schedule = "gpipe", micro_batches = 2 }}
profile = {{ steps = "{FIRST}-{LAST}", ranks = [1] }}
workers = [ {{ device = "cpu", threads = 1 }}, {{ device = "cpu", threads = 1 }} ]
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return completed_runs(tmp_path_factory.mktemp("profiling"), SUITE)


def hta(run_dir: Path):  # type: ignore[no-untyped-def]
    from hta.common.trace import Trace
    from hta.trace_analysis import TraceAnalysis

    class InProcess(TraceAnalysis):  # type: ignore[misc]
        """TraceAnalysis parses the ranks in a forked pool, and a fork of this process
        (threads of torch and of earlier tests) can hang: it did once in CI, for the
        test's whole 300 s. Trace.load_traces parses them here instead."""

        def __init__(self, trace_dir: str) -> None:
            self.t = Trace(trace_dir=trace_dir)
            # every step of the window: HTA drops the last one unless told (it may be cut
            # short)
            self.t.load_traces(include_last_profiler_step=True, use_multiprocessing=False)

    return InProcess(str(run_dir / PROFILE_DIR))


def named(analysis, rank: int, prefix: str) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """The events of `rank` whose name starts with `prefix`, with HTA's step (`iteration`)."""
    frame = analysis.t.get_trace(rank)
    names = analysis.t.symbol_table.get_sym_table()
    return frame[frame["name"].map(lambda i: names[i].startswith(prefix))]


def test_hta_reads_every_rank_and_the_window_steps_of_a_data_parallel_run(runs) -> None:
    analysis = hta(runs["pair"])
    assert sorted(analysis.t.traces) == [0, 1]  # the ranks, from each trace's distributedInfo
    assert analysis.get_profiler_steps() == list(range(FIRST, LAST + 1))
    steps = pd.read_parquet(runs["pair"] / "steps.parquet")
    for rank in (0, 1):
        mine = steps[steps["rank"] == rank].set_index("step").loc[FIRST:LAST]
        recorded_ms = (mine["end_ns"] - mine["begin_ns"]) / 1e6
        exchange_ms = mine["allreduce_ns"] / 1e6
        annotated = named(analysis, rank, "ProfilerStep#").set_index("iteration")
        allreduce = named(analysis, rank, "gloo:all_reduce").groupby("iteration")["dur"].sum()
        assert sorted(annotated.index) == list(range(FIRST, LAST + 1))
        assert sorted(allreduce.index) == list(range(FIRST, LAST + 1))
        # The annotation wraps the step hetbench times: as long or longer (µs rounding); the
        # gloo all-reduce HTA finds in step k lies within hetbench's exchange of step k.
        assert (annotated["dur"] / 1e3 >= recorded_ms - 0.01).all(), (annotated, recorded_ms)
        assert (allreduce / 1e3 <= exchange_ms + 0.01).all(), (allreduce, exchange_ms)


def test_htas_analyses_of_cpu_traces_do_what_the_profiler_howto_says(runs) -> None:
    """docs/howto/profiler.md's table of HTA's analyses on a CPU worker's traces, kept true:
    the step and event views work; the GPU analyses find no kernels (HTA reads GPU streams)
    and fail or come back empty; critical path fails in HTA 0.5's own code under pandas 3.
    A release of HTA that changes one fails this test, and the table is updated with it."""
    analysis = hta(runs["pair"])
    assert analysis.get_profiler_steps() == list(range(FIRST, LAST + 1))
    assert not named(analysis, 1, "gloo:all_reduce").empty
    with pytest.raises(IndexError):
        analysis.get_temporal_breakdown(visualize=False)
    with pytest.raises(ValueError, match="No objects to concatenate"):
        analysis.get_idle_time_breakdown(visualize=False)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    assert sorted(overlap["rank"]) == [0, 1] and overlap["comp_comm_overlap_pctg"].isna().all()
    kernels, per_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert kernels.empty and per_kernel.empty
    launches = analysis.get_cuda_kernel_launch_stats(visualize=False)
    assert launches and all(frame.empty for frame in launches.values())
    # pandas 3 in HTA's own code: "Cannot specify both 'axis' and 'index'/'columns'", or
    # (pandas.errors.UndefinedVariableError, a NameError) "name 'nan' is not defined"
    with pytest.raises((ValueError, NameError)):
        analysis.critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=FIRST + 1)


def test_a_pipeline_stage_traces_only_its_profiled_rank(runs) -> None:
    traces = sorted(p.name for p in (runs["pipeline"] / PROFILE_DIR).iterdir())
    assert traces == ["rank1.pt.trace.json.gz"]
    analysis = hta(runs["pipeline"])
    assert sorted(analysis.t.traces) == [1]
    assert analysis.get_profiler_steps() == list(range(FIRST, LAST + 1))  # waves


@pytest.mark.parametrize("name", ["pair", "pipeline"])
def test_profiled_steps_are_marked_and_left_out_of_the_summary(runs, name: str) -> None:
    data = load_run(runs[name])
    marked = sorted(data.steps.loc[data.steps["profiled"], "step"].unique())
    assert marked == list(range(FIRST, LAST + 2))  # the window and the step after it
    assert run_summary(data.steps, data.warmup_steps)["steps"] == (
        STEPS - WARMUP - (LAST + 2 - FIRST))


class Recorded:
    """Steps whose turn records the step it took, for the engine."""

    def take(self, step: int) -> Turn:
        from torch.autograd.profiler import record_function

        with record_function(f"work{step}"):
            pass
        return Turn([], step + 1 if step < 9 else None, step + 1)

    def between(self, step: int, turn: Turn) -> None:
        pass


def test_the_engine_profiles_the_window_alone(tmp_path: Path) -> None:
    profiler = StepProfiler(ProfileSpec(3, 5), cuda=False)
    run_steps(Recorded(), lambda record: None, profiler=profiler)
    assert profiler.recorded == [3, 4, 5]
    path = profiler.write(tmp_path, 0)
    assert path is not None
    import gzip
    import json

    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    names = {e.get("name") for e in events}
    assert {f"ProfilerStep#{k}" for k in (3, 4, 5)} <= names
    assert {f"work{k}" for k in (3, 4, 5)} <= names
    assert not names & {"ProfilerStep#2", "ProfilerStep#6", "work2", "work6"}


def test_a_window_the_run_never_reached_writes_no_trace(tmp_path: Path) -> None:
    profiler = StepProfiler(ProfileSpec(30, 32), cuda=False)
    run_steps(Recorded(), lambda record: None, profiler=profiler)
    assert profiler.write(tmp_path, 0) is None
    assert not (tmp_path / PROFILE_DIR).exists()


def test_samples_per_s_leaves_the_profiled_window_s_time_out() -> None:
    """Ten steps of 10 ms, 1 ms apart, 64 samples each from two workers; steps 4-5 (the
    window and the step after) took a second. Left out, they take their time with them."""
    from tests.synthetic import steps_frame

    steps = steps_frame(10, lambda rank, step: 5.0)
    begin = steps["step"] * 11_000_000 + (steps["step"] >= 6) * 1_000_000_000
    for column, offset in (("begin_ns", 0), ("ready_ns", 5), ("reduced_ns", 9),
                           ("end_ns", 10)):
        steps[column] = begin + offset * 1_000_000
    steps["profiled"] = steps["step"].between(4, 5)
    summary = run_summary(steps, 0)
    samples = steps.loc[~steps["profiled"], "batch_size"].sum()
    assert summary["steps"] == 8
    # steps 0-3 and 6-9: two spans of 4 steps, 4 x 10 ms + 3 pauses of 1 ms each
    assert summary["samples_per_s"] == pytest.approx(samples / (2 * 0.043))
    steps["profiled"] = False
    assert run_summary(steps, 0)["samples_per_s"] == pytest.approx(samples * 10 / 8 / (
        1.0 + 0.109))


def test_the_report_says_which_steps_were_profiled_and_where_the_traces_are(runs) -> None:
    from hetbench.analysis.render.report import run_section

    data = load_run(runs["pair"])
    text = "\n".join(run_section(data))
    assert (f"**Profiled**: steps {FIRST}-{LAST} on every rank" in text
            and f"steps {FIRST}-{LAST + 1} are left out" in text)
    pipeline = load_run(runs["pipeline"])
    assert "on ranks [1]" in "\n".join(run_section(pipeline))


GPU_SUITE = f"""
[[runs]]
name = "gpu"
framework = "pytorch"
workload = "cnn"
dataset = "digits"
steps = {STEPS}
warmup_steps = {WARMUP}
global_batch = 64
profile = {{ steps = "{FIRST}-{LAST}", ranks = [0] }}
workers = [ {{ device = "cuda:0" }}, {{ device = "cpu", threads = 1 }} ]
"""


@pytest.mark.gpu  # CUDA kernels in the trace need a GPU (skipped without one: conftest.py)
def test_on_a_gpu_hta_reads_the_kernels_of_the_profiled_worker(tmp_path: Path) -> None:
    """A cuda:0 worker beside a CPU one, the GPU worker profiled: HTA's GPU analyses, which
    have nothing to read on a CPU trace, find its kernels (benchmarks/gpu_check.sh)."""
    run_dir = completed_runs(tmp_path, GPU_SUITE)["gpu"]
    analysis = hta(run_dir)
    assert sorted(analysis.t.traces) == [0]
    kernel_types, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert not kernel_types.empty
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    assert temporal.loc[0, "kernel_time(us)"] > 0
