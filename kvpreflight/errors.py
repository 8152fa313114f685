"""The base of every kvpreflight exception. The CLI turns each into one line and an exit code.

The class says what went wrong, and so which exit code it means; no raise site picks a code:

- `ConfigError` (exit 2): bad arguments or configuration, found before anything ran;
- `NotMeasured` (exit 3): something could not be measured (an engine unreachable, not ready);
- `Refused` (exit 1): a gate refused (verify).

Each interface defines its own subclasses (EngineError, FormatError, RecordError, BootError, ...)
under one of these three.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ConfigError", "KvpreflightError", "NotMeasured", "Refused", "naming"]


class KvpreflightError(Exception):
    """Every error kvpreflight raises on purpose. `exit_code` is a class attribute."""

    exit_code: int = 2

    def under(self, name: str) -> KvpreflightError:
        """The same error, its message prefixed with the option or field it concerns."""
        return type(self)(f"{name}: {self}")


@contextmanager
def naming(name: str) -> Iterator[None]:
    """Errors raised inside name `name` ("--endpoint", "deployments[2].attach.entry").

    Library parsers say what is wrong with a value and name no flag; the CLI and the YAML front
    ends add where the value came from with this.
    """
    try:
        yield
    except KvpreflightError as exc:
        raise exc.under(name) from None


class ConfigError(KvpreflightError):
    """Bad arguments or configuration, found before anything ran (exit 2)."""

    exit_code = 2



class NotMeasured(KvpreflightError):
    """Something could not be measured (exit 3): never a pass."""

    exit_code = 3


class Refused(KvpreflightError):
    """A gate refused what it was given (exit 1)."""

    exit_code = 1
