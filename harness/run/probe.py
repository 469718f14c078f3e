"""Which frameworks are here: installed or not (and the extra that installs it), version,
the devices each sees, the native aggregation strategies it offers and hetbench's
aggregators for it.

Each framework is probed in a throw-away Python process with a timeout: importing a
framework in the launcher or the CLI would break the rule that they import none, and a
broken one (a crash on import, a hang while it looks for devices) must not take them down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from hetbench.adapters import FRAMEWORKS, install_hint, load_adapter, missing_framework
from hetbench.harness.spec.aggregators import AGGREGATORS
from hetbench.harness.system.exits import exit_after

MARKER = "HETBENCH-PROBE "
DEFAULT_TIMEOUT_S = 120.0

# A probe is `python -m hetbench.harness.run.probe FRAMEWORK`: it loads the framework's adapter,
# whose probe() says what the framework sees, and prints MARKER + that JSON as its last line.


@dataclass
class FrameworkInfo:
    framework: str
    status: str  # ok, not installed, broken
    install: str
    version: str = ""
    devices: list[str] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)
    # aggregator names a suite may give runs on this framework (hetbench.harness.exchange)
    hetbench_aggregators: list[str] = field(default_factory=list)
    reason: str = ""


def _start(framework: str) -> subprocess.Popen[str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", __name__, framework], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env=env, start_new_session=True)


def _finish(info: FrameworkInfo, proc: subprocess.Popen[str], timeout: float,
            deadline: float) -> None:
    # a probe that has exited already is read in full even when the deadline has passed
    remaining = max(0.0, deadline - time.monotonic())
    try:
        out, err = proc.communicate(timeout=remaining if proc.poll() is None else None)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: its children go too
        proc.communicate()
        info.status, info.reason = "broken", f"probe timed out after {timeout:g} s"
        return
    lines = [ln for ln in out.splitlines() if ln.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        if proc.returncode < 0:
            why = f"probe died with {signal.Signals(-proc.returncode).name}"
        else:
            last = [ln for ln in err.splitlines() if ln.strip()]
            why = f"probe exited with status {proc.returncode}" + (
                f": {last[-1].strip()}" if last else "")
        info.status, info.reason = "broken", why
        return
    data: dict[str, Any] = json.loads(lines[-1][len(MARKER):])
    info.version = str(data.get("version", ""))
    info.devices = list(data.get("devices", []))
    info.strategies = list(data.get("strategies", []))


def probe(framework: str, timeout: float) -> FrameworkInfo:
    """One framework, probed alone (what the launcher asks before a run on a GPU)."""
    info = _unprobed(framework)
    if info.status == "ok":
        _finish(info, _start(framework), timeout, time.monotonic() + timeout)
    return info


def _unprobed(framework: str) -> FrameworkInfo:
    """What is known without starting the framework: installed or not, hetbench's
    aggregators for it."""
    info = FrameworkInfo(framework, "ok", install_hint(framework), hetbench_aggregators=[
        name for name, k in AGGREGATORS.items() if k.framework in (None, framework)])
    if absent := missing_framework(framework):
        info.status, info.reason = "not installed", absent
    return info


def probe_all(timeout: float) -> list[FrameworkInfo]:
    """All registered frameworks; the installed ones probed concurrently."""
    infos, running = [], []
    deadline = time.monotonic() + timeout  # the probes run side by side
    for name in FRAMEWORKS:
        info = _unprobed(name)
        if info.status == "ok":
            running.append((info, _start(name)))
        infos.append(info)
    for info, proc in running:
        _finish(info, proc, timeout, deadline)
    return infos


def main(argv: list[str]) -> int:
    """In the probe's own process: the framework's adapter answers."""
    (framework,) = argv
    print(MARKER + json.dumps(load_adapter(framework).probe()), flush=True)
    return 0


if __name__ == "__main__":
    # a framework's native threads can abort the interpreter's teardown (exits.py)
    exit_after(lambda: main(sys.argv[1:]))
