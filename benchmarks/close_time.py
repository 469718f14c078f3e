"""How long closing a long run takes (issue 30): steps.parquet, the manifest and the trace
from N step records, as the launcher closes a run that a signal stopped.

    python benchmarks/close_time.py --records 1000000            # this checkout
    python benchmarks/close_time.py --records 1000000 --repo DIR # another commit's worktree

Synthetic records, two workers, monotonic timestamps of a ~10 ms step: the same rows
whatever the checkout, so the times compare. Prints the seconds to a closed manifest
(steps.parquet written and the manifest saying `interrupted`), the trace's seconds and its
size and event count.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def synthetic_parts(run_dir: Path, records: int, collector: object) -> None:
    import numpy as np

    dtype = collector.RECORD_DTYPE  # type: ignore[attr-defined]
    world = 2
    steps = records // world
    rng = np.random.default_rng(0)
    for rank in range(world):
        rows = np.zeros(steps, dtype=dtype)
        rows["rank"], rows["step"] = rank, np.arange(steps)
        rows["batch_size"], rows["slice_start"] = 32, 32 * rank
        begin = np.arange(steps, dtype=np.int64) * 10_000_000
        phases = [n for n in dtype.names if n.endswith("_ns") and n[:-3] in (
            "load", "to_device", "forward", "backward", "pack", "allreduce", "unpack", "apply")]
        durations = rng.integers(100_000, 1_000_000, size=(steps, len(phases)))
        for i, name in enumerate(phases):
            rows[name] = durations[:, i]
        cumulative = np.cumsum(durations, axis=1)
        rows["begin_ns"] = begin
        rows["ready_ns"] = begin + cumulative[:, phases.index("pack_ns")]
        rows["reduced_ns"] = begin + cumulative[:, phases.index("allreduce_ns")]
        rows["end_ns"] = begin + cumulative[:, -1]
        rows["loss"] = rows["local_loss"] = 1.0
        rows["rss_bytes"] = 1 << 28
        path = collector.part_path(run_dir, rank)  # type: ignore[attr-defined]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rows.tobytes())


def records_and_checkout(description: str) -> argparse.Namespace:
    """--records N and --repo DIR (the checkout whose harness is imported: put first on
    the path), as the benchmarks of closing and of the trace take them."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    sys.path.insert(0, str(args.repo.resolve()))
    return args


def main() -> int:
    args = records_and_checkout(__doc__ or "")
    from hetbench.harness.records import collector, rundir
    from hetbench.harness.spec.suite import load_suite

    run = load_suite("quick").runs[0]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = rundir.prepare_run_dir(Path(tmp), "quick", run, 0)
        synthetic_parts(run_dir, args.records, collector)
        began = time.time()
        rundir.close_run(run_dir, run, "interrupted", "interrupted by SIGTERM")
        done = time.time() - began
        manifest = run_dir / "manifest.json"
        trace = run_dir / collector.TRACE_FILE
        print(json.dumps({
            "records": args.records, "close_run_s": round(done, 2),
            "manifest_closed_s": round(manifest.stat().st_mtime - began, 2),
            "status": json.loads(manifest.read_text())["status"],
            "trace_written_s": round(trace.stat().st_mtime - began, 2)
            if trace.is_file() else None,
            "trace_mb": round(trace.stat().st_size / 1e6, 1) if trace.is_file() else 0,
            "trace_events": len(json.loads(trace.read_text())["traceEvents"])
            if trace.is_file() else 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
