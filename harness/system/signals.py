"""SIGTERM handled as Ctrl-C is, and signals held back while a run is being closed.

`timeout`, `kill` and CI cancellation send SIGTERM, whose default ends Python at once: the
run would stay `running` with its records in parts. `terminate_as_interrupt` turns it into
`Interrupted`, a KeyboardInterrupt, so every path that closes a run on Ctrl-C closes it
on SIGTERM too. `held` keeps a second Ctrl-C (or a SIGTERM) from cutting that closing short.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A terminating signal other than Ctrl-C's SIGINT, raised like a KeyboardInterrupt."""

    def __init__(self, number: int) -> None:
        self.number = number
        super().__init__(signal.Signals(number).name)


def describe(interrupt: KeyboardInterrupt) -> str:
    """The reason a run interrupted by it records."""
    if isinstance(interrupt, Interrupted):
        return f"interrupted by {signal.Signals(interrupt.number).name}"
    return "interrupted by the user (Ctrl-C)"


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended."""
    number = interrupt.number if isinstance(interrupt, Interrupted) else signal.SIGINT
    return 128 + int(number)


def as_interrupt(number: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if number == signal.SIGINT else Interrupted(number)


def _raise(number: int, _frame: FrameType | None) -> None:
    raise Interrupted(number)


def terminate_as_interrupt() -> None:
    """From now on a SIGTERM raises Interrupted in the main thread."""
    signal.signal(signal.SIGTERM, _raise)


@contextmanager
def held() -> Iterator[list[int]]:
    """Inside, SIGINT and SIGTERM are recorded instead of raised; yields the list they are
    recorded in, for the caller to act on once the closing is done. Only the main thread
    can handle signals: elsewhere it holds nothing back."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {number: signal.signal(number, lambda n, _f: received.append(n))
                for number in HANDLED}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
