"""The boot interface's one exception type."""

from __future__ import annotations

from kvpreflight.errors import KvpreflightError
from kvpreflight.model import EXIT_INCONCLUSIVE


class BootError(KvpreflightError):
    """A deployment could not be booted, so nothing could be measured (exit 3).

    A bad spec or a port already taken, found before anything started, is raised with
    exit_code=2 (configuration error).
    """

    exit_code = EXIT_INCONCLUSIVE
