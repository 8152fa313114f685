"""What the probes cost the engines, as the client saw it: every request kvpreflight sent, its
prompt size, what the engine said it served from cache and how many tokens it generated. The
engines' own counters (read once before and once after the probes) say what was really prefilled;
pipeline.py joins both into the report's `Cost`."""

from __future__ import annotations

import threading

from kvpreflight.model import Completion


class CostMeter:
    """Counts every request the probes send (thread-safe: the concurrent probes share it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.cached_tokens = 0  # as the answers reported it
        self.answers_without_cache_count = 0  # served answers that did not say how much was cached

    def add(self, completion: Completion) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += completion.sent_tokens
            self.generated_tokens += completion.completion_tokens or 0
            if completion.cached_tokens is not None:
                self.cached_tokens += completion.cached_tokens
            elif completion.served:
                self.answers_without_cache_count += 1

    def add_abandoned(self, prompt_tokens: int) -> None:
        """A request we disconnected on purpose: its prompt was sent, its answer never read."""
        with self._lock:
            self.requests += 1
            self.prompt_tokens += prompt_tokens
