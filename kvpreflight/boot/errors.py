"""The boot interface's one exception type."""

from __future__ import annotations

from kvpreflight.errors import ConfigError, NotMeasured


class BootError(NotMeasured):
    """A deployment could not be booted, so nothing could be measured (exit 3)."""


class BootConfigError(BootError, ConfigError):
    """A bad spec, a missing program or a port already taken, found before anything started (exit 2)."""

    exit_code = ConfigError.exit_code
