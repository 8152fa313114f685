from kvpreflight.errors import ConfigError, NotMeasured


class EngineError(NotMeasured):
    """An engine could not be read or did not answer sensibly: nothing was measured (exit 3)."""


class EngineConfigError(EngineError, ConfigError):
    """An engine option that cannot work (an unknown engine kind, an unreadable log file): exit 2."""

    exit_code = ConfigError.exit_code
