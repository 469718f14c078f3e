"""Terminating signals handled as Ctrl-C is, and signals held back while a run is closed.

`timeout`, `kill` and CI cancellation send SIGTERM, a closing terminal SIGHUP, Ctrl-\\
SIGQUIT: by default each ends Python at once, and the run would stay `running` with its
records in parts. `install` turns each into `Interrupted`, a KeyboardInterrupt, so every
path that closes a run on Ctrl-C closes it on these too. It installs Ctrl-C's handler
explicitly: a background job of a non-interactive shell (and some CI runners) starts with
SIGINT ignored, and Python then installs none. A SIGHUP ignored at start is left ignored:
that is `nohup`, asking the run to outlive the terminal. `held` keeps a second signal from
cutting a run's closing short.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(KeyboardInterrupt):
    """A terminating signal other than Ctrl-C's SIGINT, raised like a KeyboardInterrupt."""

    def __init__(self, number: int) -> None:
        self.number = number
        super().__init__(signal.Signals(number).name)


def describe(interrupt: KeyboardInterrupt) -> str:
    """The reason a run interrupted by it records."""
    if isinstance(interrupt, Interrupted):
        return f"interrupted by {signal.Signals(interrupt.number).name}"
    if interrupt.args:  # one that says why (another host was stopped: hetbench.harness.run.nodes)
        return str(interrupt.args[0])
    return "interrupted by the user (Ctrl-C)"


def number(interrupt: KeyboardInterrupt) -> int:
    """The signal that raised it (Ctrl-C's SIGINT for a plain KeyboardInterrupt)."""
    return int(interrupt.number if isinstance(interrupt, Interrupted) else signal.SIGINT)


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended."""
    return 128 + number(interrupt)


def as_interrupt(number: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if number == signal.SIGINT else Interrupted(number)


def _raise(number: int, _frame: FrameType | None) -> None:
    raise Interrupted(number)


def install() -> None:
    """From now on, in the main thread, SIGINT raises KeyboardInterrupt, and SIGTERM, SIGHUP
    (unless ignored at start: nohup) and SIGQUIT raise Interrupted."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in HANDLED[1:]:
        if number == signal.SIGHUP and signal.getsignal(number) == signal.SIG_IGN:
            continue
        signal.signal(number, _raise)


@contextmanager
def held() -> Iterator[list[int]]:
    """Inside, the handled signals are recorded instead of raised (an ignored one stays
    ignored); yields the list they are recorded in, for the caller to act on once the
    closing is done. Only the main thread can handle signals: elsewhere it holds nothing
    back."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {number: signal.signal(number, lambda n, _f: received.append(n))
                for number in HANDLED if signal.getsignal(number) != signal.SIG_IGN}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
