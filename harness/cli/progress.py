"""What a long analysis command says as it goes (`report`, `paper`, `figures`): a line on
stderr as each stage begins, with the time since the command began, as `run` says each
run's; stdout keeps the command's output (the paths it wrote, `--format json`)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, command: str) -> None:
        self.command = command
        self.began = time.monotonic()

    def __call__(self, what: str) -> None:
        elapsed = int(time.monotonic() - self.began)
        print(f"   [{elapsed // 60}:{elapsed % 60:02d} elapsed] {self.command}: {what}",
              file=sys.stderr, flush=True)

    def figures(self, what: str) -> None:
        self(f"figures {what}")
