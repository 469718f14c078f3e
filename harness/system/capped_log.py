"""A process's output written to its log through a pipe, capped: the log keeps its first
HEAD_BYTES and its last TAIL_BYTES, and says how much it left out between them.

A worker's or a service's output used to go straight to its file, so a user's factory
printing a gigabyte filled the disk under the run's records (the run was then left
`running`: its manifest could not be written). Read through a pipe by a thread of the
launcher, the output costs the launcher TAIL_BYTES of memory at most, and the disk at most
HEAD_BYTES + TAIL_BYTES per process. The head stays on disk as it comes; the tail is held
in memory and written at the end of the output (the pipe's end: the process and whatever
it started have closed it), which `settle` waits for before a log's last lines are read
for a failure's reason. A log that cannot be written (a full disk) is left as it is and
the output still read, so the process never blocks on it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO

HEAD_BYTES = 8 * 1024 * 1024
TAIL_BYTES = 2 * 1024 * 1024
CHUNK_BYTES = 64 * 1024
SETTLE_S = 2.0  # for a process's last output to reach its log once it ended


class CappedLog:
    """The log at `path`, fed by a pipe (`writer` is what the process gets as its stdout
    and stderr: pass it to Popen, then call `started`). With no `path`, only the last
    `tail_bytes` are kept, in memory (`text`)."""

    def __init__(self, path: Path | None, head_bytes: int = HEAD_BYTES,
                 tail_bytes: int = TAIL_BYTES) -> None:
        self.path, self.head_bytes, self.tail_bytes = path, head_bytes, tail_bytes
        read, self.writer = os.pipe()
        self._reader: IO[bytes] = os.fdopen(read, "rb", buffering=0)
        # the thread closes it
        self._file: IO[bytes] | None = None if path is None else open(path, "wb")  # noqa: SIM115
        self._written = 0  # bytes of the head on disk
        self._tail = bytearray()
        self.total = 0  # bytes the process wrote
        named = "memory" if path is None else path.name
        self._thread = threading.Thread(target=self._relay, daemon=True,
                                        name=f"hetbench-log-{named}")

    def started(self) -> None:
        """The process holds the pipe's write end now: ours closes, so the pipe ends when
        the process and what it started have closed theirs."""
        os.close(self.writer)
        self._thread.start()

    def settle(self, timeout_s: float = SETTLE_S) -> bool:
        """Wait up to `timeout_s` for the output to end and the log to be whole; whether
        it is (a daemon still holding the pipe keeps it open)."""
        if self._thread.ident is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def text(self) -> str:
        """The output's last `tail_bytes` as text, once it ended (`settle`)."""
        return bytes(self._tail).decode(errors="replace")

    def abandon(self) -> None:
        """The process never started: close both ends."""
        os.close(self.writer)
        self._reader.close()
        self._close_file()

    def _relay(self) -> None:
        try:
            while chunk := self._reader.read(CHUNK_BYTES):
                self.total += len(chunk)
                room = self.head_bytes - self._written
                if room > 0:
                    self._write(chunk[:room])
                    chunk = chunk[room:]
                if chunk:
                    self._tail += chunk
                    del self._tail[:max(0, len(self._tail) - self.tail_bytes)]
        finally:
            self._reader.close()
            self._finish()

    def _finish(self) -> None:
        if self._file is None:  # in memory only (or the disk full): the tail stays there
            return
        left_out = self.total - self._written - len(self._tail)
        if left_out > 0:
            self._write(f"\n[hetbench: {left_out} bytes of this log left out: it keeps the "
                        f"first {self._written} and the last {len(self._tail)} of the "
                        f"{self.total} bytes written]\n".encode())
        self._write(bytes(self._tail))
        self._tail.clear()
        self._close_file()

    def _write(self, data: bytes) -> None:
        if self._file is None or not data:
            return
        try:
            self._file.write(data)
            self._file.flush()
            self._written += len(data)
        except OSError:  # a full disk: the records matter more; the output is still read
            self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
