from kvpreflight.errors import KvpreflightError


class EngineError(KvpreflightError):
    """An engine could not be read or did not answer sensibly: nothing was measured (exit 3)."""

    exit_code = 3
