"""torch.profiler over a window of steps (a run's `profile`, harness/spec/profiling.py).

The profiler starts just before the window's first step and stops just after its last; each
step in between runs inside a `ProfilerStep#<step>` annotation named after hetbench's own
step number, which is how Holistic Trace Analysis and Perfetto find the steps. The trace is
exported once training is over, so writing it (tens of milliseconds) delays no step. With
torch.distributed initialised the profiler adds the rank's `distributedInfo`, from which HTA
reads the rank: the run directory's `profile/` holds one trace per profiled rank, the
layout `TraceAnalysis(trace_dir=...)` loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetbench.harness.spec.profiling import ProfileSpec

PROFILE_DIR = "profile"


def trace_path(run_dir: Path, rank: int) -> Path:
    return run_dir / PROFILE_DIR / f"rank{rank}.pt.trace.json.gz"


class StepProfiler:
    """Records steps spec.first to spec.last of this rank (hetbench.harness.loop.engine calls
    `begin` before each step and `end` after it). Built before training starts."""

    def __init__(self, spec: ProfileSpec, cuda: bool) -> None:
        import torch

        # Starting, the profiler asks whether torch has `_inductor`, whose first import
        # takes about a second (measured: 0.9-1.4 s on this machine class): asked here,
        # before training, that second falls on no step and no pause between steps.
        hasattr(torch, "_inductor")
        self._spec = spec
        self._cuda = cuda
        self._profile: Any = None  # torch.profiler.profile, once started
        self._running = False
        self._step: Any = None  # the open ProfilerStep annotation
        self.recorded: list[int] = []

    def begin(self, step: int) -> None:
        if not self._spec.first <= step <= self._spec.last:
            self._stop()  # a step past the window (the loop skipped its end)
            return
        from torch.profiler import ProfilerActivity, profile, record_function

        if self._profile is None:  # started once: a window is one range of steps
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda
                                                   else [])
            self._profile = profile(activities=activities)
            self._profile.start()
            self._running = True
        if self._running:
            self._step = record_function(f"ProfilerStep#{step}")
            self._step.__enter__()

    def end(self, step: int) -> None:
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
            self.recorded.append(step)
        if step >= self._spec.last:
            self._stop()

    def _stop(self) -> None:
        if not self._running:
            return
        if self._step is not None:  # a step that raised
            self._step.__exit__(None, None, None)
            self._step = None
        if self._cuda:  # the window's last kernels end before the trace does
            import torch

            torch.cuda.synchronize()
        self._profile.stop()
        self._running = False

    def write(self, run_dir: Path, rank: int) -> Path | None:
        """The rank's Kineto trace of the window (gzipped JSON, as HTA and Perfetto read it);
        None when no step of the window ran."""
        self._stop()
        if self._profile is None or not self.recorded:
            return None
        path = trace_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._profile.export_chrome_trace(str(path))
        return path


def step_profiler(spec: ProfileSpec | None, rank: int, cuda: bool) -> StepProfiler | None:
    """The rank's profiler when the run profiles it, else None (the loop runs untouched)."""
    return StepProfiler(spec, cuda) if spec is not None and spec.records(rank) else None
