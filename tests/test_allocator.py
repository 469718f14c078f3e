"""A worker's allocator keeps what a step frees (harness/system/allocator.py, a run's
`keep_freed_memory`): memory freed and taken again is not faulted back in page by page."""

from __future__ import annotations

import json
import os
import sys

from tests.conftest import REPO, Spawn

# A worker's process prepared as harness/loop/worker.py prepares it, keep_freed_memory as
# argv[1] says; then arrays of 1, 4 and 16 MiB allocated, touched and freed, as a step's
# activations come and go: the minor page faults per round after warm-up.
ROUNDS = """
import json, resource, sys
import numpy as np
from hetbench.harness.loop.worker import prepare_process
from hetbench.harness.spec.workers import WorkerSpec
prepare_process(WorkerSpec(), keep_freed_memory=sys.argv[1] == "true")
def rounds(n):
    for _ in range(n):
        arrays = [np.ones(size // 8) for size in (2**20, 2**22, 2**24)]
        del arrays
rounds(3)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(10)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
print(json.dumps({"faults": faults}))
"""


def faults_per_round(spawn: Spawn, keep_freed_memory: bool) -> float:
    # glibc made to map every allocation over 128 KiB and unmap it at free, as its moving
    # threshold may leave a process (the worst case, fixed: no chance in it)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = spawn.run([sys.executable, "-c", ROUNDS, str(keep_freed_memory).lower()],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])["faults"]


def test_memory_freed_and_taken_again_is_not_faulted_back_in(spawn: Spawn) -> None:
    """Where glibc maps and unmaps each large allocation, a round faults its arrays back in
    (the 1 MiB one alone is 256 pages; numpy asks for huge pages for the larger ones, which
    fault per 2 MiB where the kernel grants them: 1,291 faults a round here); after
    keep_freed_memory (a worker's default) the same process reuses its heap: next to no
    faults."""
    assert faults_per_round(spawn, False) >= 250
    assert faults_per_round(spawn, True) < 25
