"""Ending a hetbench process once its work is written, without the interpreter's teardown.

Native libraries' threads (pyarrow's, which pandas loads; gloo's) can abort a normal exit
with `terminate called without an active exception` (SIGABRT) once in a few dozen runs,
after every file is written and closed: the launcher then sees a worker killed by a signal
and fails a run that completed. Nothing of ours needs the teardown (files are closed by
`with` blocks and writers' close(), process groups and RPC are shut down explicitly).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_skipping_teardown(status: int) -> NoReturn:
    """Flush what was printed, then end the process with `status` at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
