"""Boot progress: events at once, "still waiting" lines at most one per interval; on stderr, or
through the caller's `say` (check --boot and demo pass theirs, so on a terminal the boot's steps
are drawn on their live line like every other step)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

from kvpreflight._internal.redact import cut


class BootProgress:
    """`scrub` removes the run's secrets from every line shown (an engine's log lines are quoted).
    `say`, when given, takes each line ("boot: ...") instead of `stream`."""

    def __init__(self, stream: TextIO | None = None, interval_s: float = 5.0,
                 scrub: Callable[[str], str] = lambda text: text, say: Callable[[str], None] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.scrub = scrub
        self.sink = say
        self._last_tick = time.monotonic()

    def say(self, message: str) -> None:
        try:
            if self.sink is not None:
                self.sink(f"boot: {self.scrub(message)}")
                return
            from kvpreflight._internal.terminal import write_line

            write_line("kvpreflight: boot", self.scrub(message), self.stream)
        except (OSError, ValueError):
            pass  # a closed stderr must not stop the boot or the clean-up

    def tick(self, message_fn: Callable[[], str]) -> None:
        """Print message_fn() if the interval has passed since the last tick line."""
        now = time.monotonic()
        if now - self._last_tick >= self.interval_s:
            self._last_tick = now
            self.say(message_fn())


# Engines print their settings at start-up (SGLang: server_args=ServerArgs(..., api_key='...')).
_SECRET = re.compile(
    r"(?i)\b([a-z_-]*(?:api[_-]?key|token|secret|password|passwd))(?![a-z_])(['\"]?\s*[=:]\s*|\s+)(['\"]?)([^'\"\s,)]+)"
)
_BEARER = re.compile(r"(?i)\b(bearer)\s+\S+")


def redact(text: str) -> str:
    """Mask what looks like a secret's value in an engine's log line before it is shown."""
    text = _SECRET.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}***", text)
    return _BEARER.sub(r"\1 ***", text)


def clip(text: str, width: int = 120) -> str:
    """One line of an engine's output, secrets masked, at most `width` characters. Remove known
    secrets before (a cut through one would leave the part before the cut)."""
    text = redact(" ".join(text.split()))
    return cut(text, width - 1)
