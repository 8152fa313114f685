"""The watcher's budget: what it sends per hour, stated at start and capped. Spending is kept in
one bucket per minute of the last hour, so memory stays bounded at any interval."""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvpreflight._internal.watch.canaries import MAX_PROMPT_TOKENS, REQUESTS_PER_ROUND
from kvpreflight._internal.watch.full import REQUESTS_PER_FULL_ROUND
from kvpreflight.errors import ConfigError

HOUR_S = 3600.0
BUCKET_S = 60.0
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_every(text: str) -> float:
    """Seconds (`3600`), or a number with a unit: `90s`, `30m`, `6h`, `1d`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(f"{text!r} is not a duration; give seconds or a number with a unit s, m, h or d (e.g. 6h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True, kw_only=True)
class BudgetPlan:
    """What the watcher will send at most, from its interval and cap."""

    interval_s: float
    max_tokens_per_hour: int | None = None
    deployments: int = 1  # watched one after another each round, under one cap
    full_every_s: float | None = None  # --full-every: a full round this often
    full_round_tokens: int | None = None  # what one full round of every deployment submits (None: not read yet)
    full_entries: int = 1  # probe runs (entries) a full round sends through, over every deployment

    @property
    def rounds_per_hour(self) -> float:
        return HOUR_S / self.interval_s

    @property
    def full_rounds_per_hour(self) -> float:
        """A full round is one of the rounds: never more often than they run."""
        if self.full_every_s is None:
            return 0.0
        return HOUR_S / max(self.full_every_s, self.interval_s)

    @property
    def requests_per_hour(self) -> int:
        return math.ceil(self.rounds_per_hour * REQUESTS_PER_ROUND * self.deployments
                         + self.full_rounds_per_hour * REQUESTS_PER_FULL_ROUND * self.full_entries)

    @property
    def canary_tokens_per_hour(self) -> int:
        """Prompt tokens per hour at the longest canary prompt, before the cap."""
        return math.ceil(self.rounds_per_hour * REQUESTS_PER_ROUND * MAX_PROMPT_TOKENS * self.deployments)

    @property
    def full_tokens_per_hour(self) -> int | None:
        if self.full_every_s is None:
            return 0
        if self.full_round_tokens is None:
            return None
        return math.ceil(self.full_rounds_per_hour * self.full_round_tokens)

    @property
    def tokens_per_hour(self) -> int | None:
        """Every prompt token per hour before the cap (None: the full rounds' size is not known)."""
        full = self.full_tokens_per_hour
        return None if full is None else self.canary_tokens_per_hour + full

    def statement(self) -> str:
        """The start-up line that says what the watcher will send."""
        per_round = (f"{REQUESTS_PER_ROUND} requests, at most {REQUESTS_PER_ROUND * MAX_PROMPT_TOKENS:,} prompt tokens and as many "
                     "generated per round")
        if self.deployments > 1:
            per_round += f" and deployment, {self.deployments} deployments"
        total = self.tokens_per_hour
        tokens = f"{total:,}" if total is not None else f"{self.canary_tokens_per_hour:,} canary"
        text = (f"budget: at most {self.requests_per_hour:,} requests and {tokens} prompt tokens per hour "
                f"({per_round}, every {self.interval_s:g} s)")
        if self.full_every_s is not None:
            each = (f"{self.full_round_tokens:,} prompt tokens" if self.full_round_tokens is not None
                    else "prompt tokens not known until the engines are read (about twice the served context)")
            per_hour = (f"{self.full_tokens_per_hour:,} prompt tokens per hour" if self.full_tokens_per_hour is not None
                        else "its prompt tokens per hour said once known")
            text += (f"; a full round every {max(self.full_every_s, self.interval_s):g} s (--full-every): "
                     f"{REQUESTS_PER_FULL_ROUND * self.full_entries} more requests, one near the served context and one over "
                     f"capacity that must be refused, {each}, {per_hour}")
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
