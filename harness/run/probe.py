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

from harness.spec.aggregators import AGGREGATORS

MARKER = "HETBENCH-PROBE "
DEFAULT_TIMEOUT_S = 120.0

# Each probe prints MARKER + JSON {version, devices, strategies} as its last line.
_TORCH_PROBE = """
import json, torch, torch.distributed as dist
devices = ["cpu"] + [f"cuda:{i} ({torch.cuda.get_device_name(i)})"
                     for i in range(torch.cuda.device_count())]
backends = [b for b, ok in (("gloo", dist.is_gloo_available()),
                            ("nccl", dist.is_nccl_available()),
                            ("mpi", dist.is_mpi_available()),
                            ("ucc", getattr(dist, "is_ucc_available", lambda: False)()))
            if ok]
print(MARKER + json.dumps({"version": torch.__version__, "devices": devices,
                           "strategies": [f"torch.distributed {b}" for b in backends]}))
"""
_TENSORFLOW_PROBE = """
import json, tensorflow as tf
devices = [f"{d.device_type.lower()}:{d.name.rsplit(':', 1)[-1]}"
           for d in tf.config.list_physical_devices()]
strategies = ["MultiWorkerMirroredStrategy (collective all-reduce: ring"
              + (", nccl" if tf.config.list_physical_devices("GPU") else "") + ")",
              "ParameterServerStrategy (asynchronous)"]
print(MARKER + json.dumps({"version": tf.__version__, "devices": devices,
                           "strategies": strategies}))
"""
_MXNET_PROBE = """
import json, numpy
if "bool" not in vars(numpy):
    numpy.bool = bool
import mxnet as mx
devices = ["cpu"] + [f"gpu:{i}" for i in range(mx.context.num_gpus())]
features = mx.runtime.Features()
stores = ["kvstore local", "kvstore device"]
if features.is_enabled("DIST_KVSTORE"):
    stores += ["kvstore dist_sync", "kvstore dist_device_sync", "kvstore dist_async"]
if features.is_enabled("NCCL"):
    stores.append("kvstore nccl")
print(MARKER + json.dumps({"version": mx.__version__, "devices": devices,
                           "strategies": stores}))
"""
PROBES = {"pytorch": _TORCH_PROBE, "tensorflow": _TENSORFLOW_PROBE, "mxnet": _MXNET_PROBE}


@dataclass
class FrameworkInfo:
    framework: str
    status: str  # ok, not installed, broken
    install: str
    version: str = ""
    devices: list[str] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)
    # aggregator names a suite may give runs on this framework (harness.exchange)
    hetbench_aggregators: list[str] = field(default_factory=list)
    reason: str = ""


def _start(framework: str) -> subprocess.Popen[str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    code = f"MARKER = {MARKER!r}\n{PROBES[framework]}"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
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
    from adapters import install_hint, missing_framework

    info = FrameworkInfo(framework, "ok", install_hint(framework), hetbench_aggregators=[
        name for name, k in AGGREGATORS.items() if k.framework in (None, framework)])
    if absent := missing_framework(framework):
        info.status, info.reason = "not installed", absent
    return info


def probe_all(timeout: float) -> list[FrameworkInfo]:
    """All registered frameworks; the installed ones probed concurrently."""
    from adapters import FRAMEWORKS

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


