"""The base of every interface's exception. The CLI turns each into one line and an exit code.

Each interface defines its own subclass (EngineError, FormatError, SigningError, BootError, ...)
and says which exit code it means: 2 for a usage or configuration error found before anything
ran, 3 for "could not measure", 1 for a refusal (verify).
"""

from __future__ import annotations


class KvpreflightError(Exception):
    exit_code: int = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(KvpreflightError):
    """Bad arguments or configuration, found before anything ran."""

    exit_code = 2
