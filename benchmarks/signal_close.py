"""Time from a signal to a closed manifest, for a real `hetbench run` that has flushed N
steps (issue 30: an 86,000-step run stayed `running` two minutes after SIGTERM).

    python benchmarks/signal_close.py --signal SIGTERM --steps 100000 --out /tmp/sigclose

Runs an MLP on two CPU workers (one slowed 2x, global batch 16) until N steps are flushed,
sends the signal to the launcher, and prints one JSON line: the seconds until the manifest
no longer says `running`, until the launcher exited, the status, reason and trace size.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = """
[suite]
name = "sigclose"

[[runs]]
name = "long"
steps = {steps}
global_batch = 16
timeout_s = 60
workers = [ {{ device = "cpu" }}, {{ device = "cpu", slowdown = 2.0 }} ]
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--signal", default="SIGTERM",
                        choices=["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from hetbench.harness.records import collector

    args.out.mkdir(parents=True, exist_ok=True)
    suite = args.out / "suite.toml"
    suite.write_text(SUITE.format(steps=4 * args.steps))  # never ends before the signal
    proc = subprocess.Popen([sys.executable, "-m", "hetbench.harness.cli.main", "run", str(suite),
                             "--out", str(args.out), "--no-progress"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        began, deadline = time.monotonic(), time.monotonic() + args.timeout_s
        while True:
            runs = sorted((args.out / "sigclose").glob("long-*"))
            if runs and collector.steps_done(runs[-1], 2) >= args.steps:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                print(f"the run ended or took too long: {proc.returncode}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        flushed = collector.steps_done(runs[-1], 2)
        sent = time.monotonic()
        proc.send_signal(getattr(signal, args.signal))
        manifest = runs[-1] / "manifest.json"
        while json.loads(manifest.read_text()).get("status") == "running":
            if time.monotonic() - sent > 300:
                print("the manifest still says running after 300 s", file=sys.stderr)
                return 1
            time.sleep(0.05)
        closed = time.monotonic() - sent
        proc.wait(timeout=300)
        exited = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    meta = json.loads(manifest.read_text())
    trace = runs[-1] / collector.TRACE_FILE
    print(json.dumps({"signal": args.signal, "steps_flushed": flushed, "rows": meta.get("rows"),
                      "training_s": round(sent - began, 1), "manifest_closed_s": round(closed, 2),
                      "launcher_exited_s": round(exited, 2), "exit_status": proc.returncode,
                      "status": meta["status"], "reason": meta["reason"],
                      "trace_mb": round(trace.stat().st_size / 1e6, 1)
                      if trace.is_file() else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
