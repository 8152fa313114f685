"""The one exception type of the record interface (keys, envelopes, statements, verification)."""

from __future__ import annotations

from collections.abc import Sequence

from kvpreflight.errors import ConfigError, Refused


class RecordError(ConfigError):
    """A record could not be made or read: bad input, found before anything was judged (a missing
    or malformed file, an unreadable key, a bad ``--subject``): exit 2."""


class PredicateError(RecordError):
    """A record's predicate that does not read: `problems` holds every value found wrong in it, not
    only the first, so one message names the whole damage."""

    problems: tuple[str, ...] = ()

    @classmethod
    def of(cls, what: str, problems: Sequence[str]) -> PredicateError:
        error = cls(f"malformed {what}: {'; '.join(problems)}; the record is damaged or not a kvpreflight record")
        error.problems = tuple(problems)
        return error

    def under(self, name: str) -> PredicateError:
        """The same error named under `name`, its problems kept (the base rebuilds from the message)."""
        error = type(self)(f"{name}: {self}")
        error.problems = self.problems
        return error


class RecordRefused(RecordError, Refused):
    """A record that was read fine but is not accepted by ``verify``: exit 1."""

    exit_code = Refused.exit_code


def refusal(message: str) -> RecordRefused:
    """A record that was read fine but is not accepted: exit 1."""
    return RecordRefused(f"refused: {message}")
