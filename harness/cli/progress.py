"""What a long analysis command says as it goes (`report`, `paper`, `figures`): a line on
stderr as each stage begins, with the time since the command began, as `run` says each
run's; stdout keeps the command's output (the paths it wrote, `--format json`). Only to a
person at a terminal, as `run`'s step bar: a script or a log reading stderr gets the
command's warnings and its one line of an error, nothing else."""

from __future__ import annotations

import sys
import time


def clock(seconds: float) -> str:
    """Elapsed time as `run` and these commands say it: 0:36, 1:02:05."""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 \
        else f"{minutes}:{secs:02d}"


class Progress:
    def __init__(self, command: str, shown: bool | None = None) -> None:
        self.command = command
        self.shown = sys.stderr.isatty() if shown is None else shown
        self.began = time.monotonic()

    def __call__(self, what: str) -> None:
        if not self.shown:
            return
        print(f"   [{clock(time.monotonic() - self.began)} elapsed] {self.command}: {what}",
              file=sys.stderr, flush=True)

    def figures(self, what: str) -> None:
        self(f"figures {what}")
