"""Python's cyclic garbage collector over a run's steps (RunSpec.gc): as Python runs it,
frozen, or off; what `hetbench explain` sets to take the `gc` cause away."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def steps_collection(mode: str) -> Iterator[None]:
    """Over the steps: "auto" leaves the collector as it is; "frozen" moves every object
    built before the first step (the model, the data, the framework's own) into the
    permanent generation (gc.freeze), so that a full collection no longer walks them,
    while the garbage the steps make is still collected; "off" disables it (reference
    cycles the steps make accumulate until it is enabled again, after the last step).
    Nothing is collected here: a collection before the first step would be timed into it
    (harness/loop/counters.py's callbacks)."""
    if mode == "frozen":
        gc.freeze()
    elif mode == "off":
        was_enabled = gc.isenabled()
        gc.disable()
    try:
        yield
    finally:
        if mode == "frozen":
            gc.unfreeze()
        elif mode == "off" and was_enabled:
            gc.enable()
