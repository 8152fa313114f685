"""Log patterns: how an adapter reads one engine's or router's log lines without letting a
tenant's request text (which engines log) cost more than linear time or travel into a report."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from kvpreflight.model import Hazard


def gap(after: str, most: int = 1000) -> str:
    """The pattern for what may stand, in one log line, between the phrase `after` and what a
    pattern reads next: at most `most` characters, never another `after`. Engines log request
    text, so a tenant can write a line of the phrase repeated; a pattern scanning to the line's
    end from each repetition would be quadratic, this one reads each character a bounded number
    of times."""
    return rf"(?:(?!{re.escape(after)})[^\n]){{0,{most}}}?"


REQUEST_ID = r"{1,200}"  # how many characters of a request id a log pattern reads (an id is short)
# How much of one log line the patterns read: an engine's own lines are far shorter (SGLang's
# ServerArgs line, the longest, is a few KiB); a longer one is request text a tenant wrote.
MAX_LOG_LINE_CHARS = 64 << 10


def log_lines(text: str) -> Iterator[str]:
    """The lines of a log as the patterns read them: each at most MAX_LOG_LINE_CHARS."""
    for line in text.splitlines():
        yield line[:MAX_LOG_LINE_CHARS]


@dataclass(frozen=True)
class LogSignal:
    """A log line that says a request's KV may not have moved as it should, as one engine or
    router kind words it; `pattern` names the request in a group "rid" where the line does."""

    what: str  # the line's fixed wording, quoted in reports instead of the line itself
    pattern: re.Pattern[str]
    hazard: Hazard = Hazard.TRANSFER
    # Groups of `pattern` quoted beside the wording (slot, position, reason): the pattern admits
    # only numbers and fixed labels in them, so nothing else of the line travels on.
    detail_groups: tuple[str, ...] = ()
    setting: str | None = None  # the engine setting the line is about (a timeout to raise), quoted as setting=NAME

    def request_in(self, line: str) -> tuple[bool, str | None]:
        """Whether the line is this signal, and the request id it names."""
        m = self.pattern.search(line, 0, MAX_LOG_LINE_CHARS)
        if m is None:
            return False, None
        return True, m.groupdict().get("rid")

    def detail_in(self, line: str) -> str | None:
        said = [f"setting={self.setting}"] if self.setting else []
        m = self.pattern.search(line) if self.detail_groups else None
        if m is not None:
            said += [f"{g}={m[g]}" for g in self.detail_groups if m[g] is not None]
        return " ".join(said) or None
