"""The one timestamp format of reports and records: RFC 3339, UTC, whole seconds, `Z`."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime) -> str:
    """`moment` (timezone-aware) as `2026-01-01T12:00:00Z`."""
    if moment.tzinfo is None:
        raise ValueError("a timestamp must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now() -> str:
    """Now, as `2026-01-01T12:00:00Z`."""
    return rfc3339(datetime.now(UTC))
