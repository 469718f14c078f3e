"""How precisely this thread's sleeps end: Linux lets a sleep end up to the thread's timer
slack late (50 us by default) so that wake-ups can be merged; an emulated device's stretch
(harness/spec/emulation.py) wants its sleeps to end on time."""

from __future__ import annotations

import ctypes
import sys

_PR_SET_TIMERSLACK = 29


def precise_sleeps() -> bool:
    """The calling thread's timer slack set to 1 ns; False where that cannot be done."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return bool(libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0) == 0)
