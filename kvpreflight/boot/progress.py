"""Boot progress on stderr: events at once, "still waiting" lines at most one per interval."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, interval_s: float = 5.0) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self._last_tick = time.monotonic()

    def say(self, message: str) -> None:
        try:
            self.stream.write(f"kvpreflight: boot: {message}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not stop the boot or the clean-up

    def tick(self, message_fn) -> None:
        """Print message_fn() if the interval has passed since the last tick line."""
        now = time.monotonic()
        if now - self._last_tick >= self.interval_s:
            self._last_tick = now
            self.say(message_fn())


def clip(text: str, width: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
