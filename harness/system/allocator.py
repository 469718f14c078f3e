"""glibc's malloc told to keep the memory a step frees, rather than return it to the OS.

By default glibc serves a large allocation (above a threshold that moves with what the
process freed before) with its own mmap and gives it back at free, and trims the heap's
free top: a training step's activations, freed at its end, are then faulted back in page
by page at the next step. Where the threshold stands depends on the allocation history,
so two processes running the same step differ: on ResNet small (2 workers, 2 cores,
2026-11-27) a hetbench worker took 43,000 minor faults a second against DDP's 29,000, the
kernel's page-fault path 19% of its CPU samples against 6%; with both told to keep their
memory, ~340 faults a second each, both steps ~10% shorter, and hetbench's step 1.001x
DDP's (docs/measurements.md).

A run's `keep_freed_memory` (default true) sets the thresholds in each worker as it
starts (harness/loop/worker.py); false leaves glibc's own, to study what they cost.
`ENVIRONMENT` is the same setting for a process glibc has not started yet (the DDP
reference of benchmarks/ddp_compare.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util

# The largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2): allocations up
# to it come from the heap and are reused; larger ones are still mapped and unmapped.
MMAP_THRESHOLD_BYTES = 32 * 2**20
# Free memory at the heap's top is returned to the OS only beyond this.
TRIM_THRESHOLD_BYTES = 128 * 2**20
# mallopt(3) parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3

ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
               "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES)}


def keep_freed_memory() -> bool:
    """Fix both thresholds in this process (glibc then stops moving them); whether glibc
    took both (False where the C library is not glibc: nothing changes)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
