"""How long trace.json takes to write, and how large it is (issue 31, part 4).

    python benchmarks/trace_time.py --records 1000000                 # this checkout
    python benchmarks/trace_time.py --records 100000 --repo DIR       # another commit's

Synthetic records (two workers, ~10 ms steps: benchmarks/close_time.py's), written as a
trace twice: as a run closes with the default window (the last `trace_steps` steps of the
suite default, at most MAX_ROWS rows where the writer has that bound), and whole (every
row, the bound lifted). Prints one JSON line per case: seconds, MB, events. A checkout
before the vectorised writer (hetbench.harness.records.collector.write_trace) is timed the same way.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from close_time import records_and_checkout, synthetic_parts

    args = records_and_checkout(__doc__ or "")
    import numpy as np
    import pandas as pd

    from hetbench.harness.records import collector
    from hetbench.harness.spec.suite import RunSpec

    try:
        from hetbench.harness.records import trace as writer
        write: Any = writer.write_trace
    except ImportError:  # before the vectorised writer
        writer, write = None, collector.write_trace
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        synthetic_parts(run_dir, args.records, collector)
        frame = pd.concat([pd.DataFrame(np.fromfile(p, dtype=collector.RECORD_DTYPE))
                           for p in sorted((run_dir / collector.PARTS_DIR).glob("*"))
                           if p.suffix != ".error"], ignore_index=True)
        frame = frame.sort_values(["step", "rank"], kind="stable", ignore_index=True)
        for case, window in (("default window", RunSpec.trace_steps), ("whole run", None)):
            if writer is not None and window is None:
                writer.MAX_ROWS = len(frame)
            began = time.perf_counter()
            write(run_dir, frame, ["a", "b"], window)
            seconds = time.perf_counter() - began
            path = run_dir / collector.TRACE_FILE
            print(json.dumps({"records": args.records, "case": case,
                              "seconds": round(seconds, 2),
                              "mb": round(path.stat().st_size / 1e6, 1),
                              "events": sum(1 for _ in path.open()) - 2}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
