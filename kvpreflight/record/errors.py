"""The one exception type of the record interface (keys, envelopes, statements, verification)."""

from __future__ import annotations

from kvpreflight.errors import ConfigError, Refused


class RecordError(ConfigError):
    """A record could not be made or read: bad input, found before anything was judged (a missing
    or malformed file, an unreadable key, a bad ``--subject``): exit 2."""


class RecordRefused(RecordError, Refused):
    """A record that was read fine but is not accepted by ``verify``: exit 1."""

    exit_code = Refused.exit_code


def refusal(message: str) -> RecordRefused:
    """A record that was read fine but is not accepted: exit 1."""
    return RecordRefused(f"refused: {message}")
