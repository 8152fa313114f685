"""The one exception type of the record interface (keys, envelopes, statements, verification)."""

from __future__ import annotations

from kvpreflight.errors import KvpreflightError


class RecordError(KvpreflightError):
    """A record could not be made, read or accepted.

    exit_code 2 (the default): bad input, found before anything was judged (a missing or malformed
    file, an unreadable key, a bad ``--subject``). exit_code 1: ``verify`` refuses the record (see
    :func:`refusal`).
    """

    exit_code = 2


def refusal(message: str) -> RecordError:
    """A record that was read fine but is not accepted: exit 1."""
    return RecordError(f"refused: {message}", exit_code=1)
