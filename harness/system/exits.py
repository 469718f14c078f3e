"""Ending a hetbench process once its work is written, without the interpreter's teardown.

Native libraries' threads (pyarrow's, which pandas loads; gloo's) can abort a normal exit
with `terminate called without an active exception` (SIGABRT) once in a few dozen runs,
after every file is written and closed: the launcher then sees a worker killed by a signal
and fails a run that completed. Nothing of ours needs the teardown (files are closed by
`with` blocks and writers' close(), process groups and RPC are shut down explicitly).
Every entry point runs its main through `exit_after`, so that an exception, or a signal that
comes as the work returns, cannot start the teardown either.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

# the signals whose handlers raise (signals.py, the worker's Stopped): once the work is
# done, one arriving late must not turn the exit into an exception, whose unwinding runs
# the teardown this module skips (an MXNet worker hung there for good)
LATE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def exit_skipping_teardown(status: int) -> NoReturn:
    """Flush what was printed, then end the process with `status` at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def exit_after(main: Callable[[], int]) -> NoReturn:
    """Run `main`, then exit with its status skipping the teardown, whatever it raised and
    whatever signal came as it returned (status 1 then, the error printed)."""
    status = 1
    try:
        try:
            status = main()
        finally:
            for number in LATE_SIGNALS:  # a handler not yet run is skipped once ignored
                signal.signal(number, signal.SIG_IGN)
    except SystemExit as exc:  # sys.exit() and argparse's --help, usage errors
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # noqa: BLE001 - printed, then the exit below
        traceback.print_exc()
    exit_skipping_teardown(status)
