"""The fleet interface's exception: a bad inventory or fleet option (exit 2), before anything runs."""

from __future__ import annotations

from kvpreflight.errors import ConfigError


class FleetError(ConfigError):
    """A bad inventory or fleet option."""
