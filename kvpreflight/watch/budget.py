"""The watcher's budget: what it sends per hour, stated at start and capped. Spending is kept in
one bucket per minute of the last hour, so memory stays bounded at any interval."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvpreflight.watch.canaries import MAX_PROMPT_TOKENS, REQUESTS_PER_ROUND

HOUR_S = 3600.0
BUCKET_S = 60.0


@dataclass(frozen=True, kw_only=True)
class BudgetPlan:
    """What the watcher will send at most, from its interval and cap."""

    interval_s: float
    max_tokens_per_hour: int | None = None

    @property
    def rounds_per_hour(self) -> float:
        return HOUR_S / self.interval_s

    @property
    def requests_per_hour(self) -> int:
        return math.ceil(self.rounds_per_hour * REQUESTS_PER_ROUND)

    @property
    def tokens_per_hour(self) -> int:
        """Prompt tokens per hour at the longest canary prompt, before the cap."""
        return math.ceil(self.rounds_per_hour * REQUESTS_PER_ROUND * MAX_PROMPT_TOKENS)

    def statement(self) -> str:
        """The start-up line that says what the watcher will send."""
        per_round = (f"{REQUESTS_PER_ROUND} requests, at most {REQUESTS_PER_ROUND * MAX_PROMPT_TOKENS:,} prompt tokens and as many "
                     "generated per round")
        text = (f"budget: at most {self.requests_per_hour:,} requests and {self.tokens_per_hour:,} prompt tokens per hour "
                f"({per_round}, every {self.interval_s:g} s)")
        if self.max_tokens_per_hour is not None:
            text += (f"; capped at {self.max_tokens_per_hour:,} prompt tokens per hour (--max-tokens-per-hour): "
                     "a round that would go over it is skipped and said")
        return text


class HourlySpend:
    """Requests and prompt tokens sent over the last hour, in minute buckets."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: deque[list[float]] = deque()  # [minute start, requests, tokens], oldest first

    def _trim(self) -> float:
        now = self._clock()
        while self._buckets and self._buckets[0][0] <= now - HOUR_S:
            self._buckets.popleft()
        return now

    def add(self, requests: int, tokens: int) -> None:
        now = self._trim()
        minute = now - now % BUCKET_S
        if not self._buckets or self._buckets[-1][0] != minute:
            self._buckets.append([minute, 0, 0])
        self._buckets[-1][1] += requests
        self._buckets[-1][2] += tokens

    def last_hour(self) -> tuple[int, int]:
        self._trim()
        return int(sum(b[1] for b in self._buckets)), int(sum(b[2] for b in self._buckets))

    def allows(self, tokens: int, cap: int | None) -> bool:
        return cap is None or self.last_hour()[1] + tokens <= cap
