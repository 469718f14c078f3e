"""Errors meant for people: one line, naming the field or path and what is allowed."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input (suite file, arguments, result folder). The CLI prints it and exits 2."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class DeviceUnavailable(UsageError):
    """A worker names a device this machine does not have (skippable with --skip-unavailable)."""
