"""How long each probe request, each stage and the whole check may take: from the engine's
measured speed, not from an assumed one.

Before the probes, `calibrate` sends two short accepted prompts through the entry: a tiny one
(the fixed cost of one request: routing, queueing, a PD handoff) and a streamed short one (its
time to first token less the tiny one's time is prefill; its later tokens are decode). Then:

  must be accepted   --timeout + SLACK x (what the measured speed predicts for its size).
                     Past it the request is stalled, not slow: inconclusive, never a fail by itself.
  must be rejected   --timeout + SLACK x the fixed cost + the time to upload its body. A clear
                     rejection needs no prefill; past it a hang is not a rejection (the incident).
  the whole check    --deadline (default SLACK x the estimate printed before the probes start, plus
                     room for the waits); every request's budget is cut to what is left of it, and a
                     request cut short by the deadline proves nothing: it is dropped and the checks
                     that needed it say where the run stopped.

An engine that stops answering is probed no further: `stop()` records why, and every later
request is not sent.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.probes.cost import CostMeter
from kvpreflight._internal.probes.engine_state import EngineState
from kvpreflight._internal.probes.results import Expect
from kvpreflight._internal.probes.tokens import valid_token_ids
from kvpreflight.model import Completion

SLACK = 3.0  # an honest engine slower than 3x its own measured speed is stalled, not slow
TINY_TOKENS = 8
SHORT_MAX_TOKENS = 8  # streamed: the tokens after the first measure decode
# The short calibration prompt's largest size. Its prefill must stand clear of the fixed cost of a
# request for the measured speed to mean anything (plausibility trusts no speed that does not): at
# a 1M context on a GPU, 1,024 tokens prefill in a few milliseconds, within a P/D pair's per-request
# spread, and no answer could be judged. 16,384 is 1/64 of a 1M-token prompt's prefill.
SHORT_MAX_PROMPT = 16_384
WARM_UP_TIMEOUTS = 3  # the warm-up request may take this many times --timeout
UPLOAD_TOKENS_PER_S = 1_000_000.0  # token ids travel as JSON text: about 8 MB/s for a body of ids
DEADLINE_WAITS_S = 120.0  # room in the default deadline for idle waits and counter reads
MIN_MEASURABLE_S = 0.001


@dataclass(frozen=True)
class PlannedRequest:
    """One request a prober will send: enough to predict its cost before it is sent."""

    name: str
    prompt_tokens: int
    max_tokens: int
    expect: Expect
    concurrent: int = 1  # sent at once with this many of the same size (prefill serialises)
    only_if: str | None = None  # sent only under this condition (the timing audit); None: always


@dataclass(frozen=True)
class Speed:
    """What the calibration requests measured through the entry."""

    overhead_s: float  # the tiny request's whole time: the fixed cost of any request
    prefill_tokens_per_second: float
    decode_s_per_token: float
    measured_on: str
    # The measured request's time past the fixed cost: its prefill, as far as the two requests can
    # tell. Small next to the run's fixed-cost spread, the speed is noise (plausibility trusts it not).
    prefill_s: float = 0.0

    def expected_s(self, prompt_tokens: int, max_tokens: int = 1, concurrent: int = 1) -> float:
        return (self.overhead_s + concurrent * prompt_tokens / self.prefill_tokens_per_second
                + max(0, max_tokens - 1) * self.decode_s_per_token)

    def describe(self) -> str:
        return (f"{self.prefill_tokens_per_second:,.0f} prompt tokens/s, {self.decode_s_per_token * 1000:.2f} ms per "
                f"generated token, {self.overhead_s:.2f} s per request ({self.measured_on})")


@dataclass(frozen=True)
class Calibration:
    speed: Speed | None
    completions: tuple[Completion, ...] = ()
    failure: str | None = None  # why no speed was measured
    retried: tuple[str, ...] = ()  # calibration requests that got no answer and were sent again


def _short_prompt_tokens(max_accepted: int) -> int:
    """The short calibration prompt: about 1/16 of the longest accepted prompt, 16 to 16,384 tokens."""
    return max(TINY_TOKENS * 2, min(SHORT_MAX_PROMPT, max_accepted // 16))


def calibration_plan(max_accepted: int) -> tuple[PlannedRequest, ...]:
    """What `calibrate` sends when every request is answered: the warm-up, then two measured."""
    return (PlannedRequest("calibration warm-up", TINY_TOKENS, 1, Expect.ACCEPT),
            PlannedRequest("calibration", TINY_TOKENS, 1, Expect.ACCEPT),
            PlannedRequest("calibration", _short_prompt_tokens(max_accepted), SHORT_MAX_TOKENS, Expect.ACCEPT))


def _warm_up_timeout_s(budget: Budget, timeout_s: float) -> float:
    """A deployment's first request may take WARM_UP_TIMEOUTS x --timeout (one-time set-up)."""
    return min(WARM_UP_TIMEOUTS * timeout_s, max(timeout_s, budget.remaining_s()))


def _first_token_and_decode_s(c: Completion) -> tuple[float, float]:
    """A streamed answer's time to its first token, and the time per token generated after it."""
    first_token = c.first_token_s
    return first_token, max(0.0, c.elapsed_s - first_token) / max(1, (c.completion_tokens or 1) - 1)


def calibrate(entry: EngineAdapter, engines: Iterable[EngineAdapter], budget: Budget, *, max_accepted: int,
              timeout_s: float) -> Calibration:
    """Two short accepted prompts through the entry (see the module docstring). Each must be
    served within --timeout: an engine that cannot answer eight tokens in that time is probed no
    further."""
    engines = list(engines)
    short = _short_prompt_tokens(max_accepted)
    try:
        tiny_ids = valid_token_ids(entry, engines, TINY_TOKENS, _fresh("calibration"))
        short_ids = valid_token_ids(entry, engines, short, _fresh("calibration"))
    except EngineError as exc:
        return Calibration(None, failure=f"no calibration prompt could be tokenized: {exc}")
    # The first request to a cold deployment pays one-time costs (a P/D pair's first KV transfer
    # sets up NIXL, which took over 30 s on 2 CPU cores): it is not the engine's speed. One
    # unmeasured warm-up, allowed 3x --timeout, must be served before anything is measured.
    warm = budget.send(entry, tiny_ids, max_tokens=1, stream=False, timeout_s=_warm_up_timeout_s(budget, timeout_s))
    if not warm.served:
        return Calibration(None, (warm,), _unserved(warm, "an 8-token warm-up request"))
    sent: list[Completion] = [warm]
    retried: list[str] = []

    def measured(tokens: int, ids: list[int], *, max_tokens: int, stream: bool, what: str) -> Completion:
        """One calibration request; one that got no answer at all is sent once more, fresh: a
        vLLM P/D pair on 2 CPU cores once left a single 8-token request unanswered for 30 s
        and served the rest. A second silence means the engine is not answering."""
        first = budget.send(entry, ids, max_tokens=max_tokens, stream=stream, timeout_s=timeout_s)
        sent.append(first)
        if first.served or not first.timed_out or not budget.may_send():
            return first
        retried.append(f"{what} got no answer within --timeout ({first.elapsed_s:.1f} s); a fresh one was sent")
        again = budget.send(entry, valid_token_ids(entry, engines, tokens, _fresh("calibration")), max_tokens=max_tokens,
                            stream=stream, timeout_s=timeout_s)
        sent.append(again)
        return again

    try:
        tiny = measured(TINY_TOKENS, tiny_ids, max_tokens=1, stream=False, what="an 8-token calibration request")
        if not tiny.served:
            return Calibration(None, tuple(sent), _unserved(tiny, "an 8-token calibration request"), tuple(retried))
        second = measured(short, short_ids, max_tokens=SHORT_MAX_TOKENS, stream=True,
                          what=f"a {short}-token calibration request")
    except EngineError as exc:
        return Calibration(None, tuple(sent), f"no calibration prompt could be tokenized: {exc}", tuple(retried))
    if not second.served:
        return Calibration(None, tuple(sent), _unserved(second, f"a {short}-token calibration request"), tuple(retried))
    first_token, decode = _first_token_and_decode_s(second)
    prefill_s = max(first_token - tiny.elapsed_s, first_token * 0.05, MIN_MEASURABLE_S)
    speed = Speed(overhead_s=tiny.elapsed_s, prefill_tokens_per_second=short / prefill_s, decode_s_per_token=decode,
                  measured_on=f"{TINY_TOKENS}- and {short}-token requests through the entry", prefill_s=prefill_s)
    return Calibration(speed, tuple(sent), retried=tuple(retried))


def calibrate_once(entry: EngineAdapter, engines: Iterable[EngineAdapter], budget: Budget, *, max_accepted: int,
                   timeout_s: float) -> Calibration:
    """`check --plan`'s calibration: ONE streamed short prompt through the entry, allowed the
    warm-up's time (it may be the deployment's first request) and never sent again. One request
    cannot separate the fixed cost of a request from prefill, so both are taken at their upper
    bound (the fixed cost is at most its time to first token; prefill is at least as fast as its
    prompt over that time): the plan's duration is an upper estimate, never an optimistic one."""
    short = _short_prompt_tokens(max_accepted)
    try:
        ids = valid_token_ids(entry, list(engines), short, _fresh("calibration"))
    except EngineError as exc:
        return Calibration(None, failure=f"no calibration prompt could be tokenized: {exc}")
    answer = budget.send(entry, ids, max_tokens=SHORT_MAX_TOKENS, stream=True,
                         timeout_s=_warm_up_timeout_s(budget, timeout_s))
    if not answer.served:
        return Calibration(None, (answer,), _unserved(answer, f"a {short}-token calibration request"))
    first_token, decode = _first_token_and_decode_s(answer)
    first_token = max(first_token, MIN_MEASURABLE_S)
    speed = Speed(overhead_s=first_token, prefill_tokens_per_second=short / first_token, decode_s_per_token=decode,
                  measured_on=f"one {short}-token request through the entry; an upper estimate: its fixed cost "
                              "is not separated from prefill, and a cold deployment's one-time setup is included")
    return Calibration(speed, (answer,))


def _fresh(purpose: str) -> str:
    """A prompt no cache holds. Not marker-shaped: stale pages that still hold it later are not
    mistaken for another tenant's data (the probes' markers are what is scanned for)."""
    return f"kvpreflight {purpose} {secrets.token_hex(6)} "


def _unserved(c: Completion, what: str) -> str:
    if c.timed_out:
        return f"{what} got no answer within --timeout ({c.elapsed_s:.1f} s): the engine is not answering"
    why = c.transport_error or f"HTTP {c.status}: {c.error_message or 'no error message'}"
    return f"{what} was not served ({why})"


class Budget:
    """The time budgets of one check run; shared by every prober of the run (thread-safe)."""

    def __init__(self, *, timeout_s: float, fallback_tokens_per_second: float, deadline_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.fallback_tokens_per_second = fallback_tokens_per_second
        self.deadline_s = deadline_s
        self.deadline_given = deadline_s is not None
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self.speed: Speed | None = None
        self.stage = "reading the engines"
        self.stopped: str | None = None  # why no further request is sent
        # Why the run stopped because the engine stopped answering (a finding about its health,
        # where a deadline stop is not): engine-healthy-after fails on it whatever /health says.
        self.not_answering: str | None = None
        self.cost = CostMeter()  # every request sent under this budget

    # -- what is measured --------------------------------------------------------------------------
    def calibrated(self, speed: Speed | None, planned: Iterable[PlannedRequest]) -> float | None:
        """Adopt the measured speed; returns the estimate of the planned requests (None without a
        speed). Without --deadline the deadline becomes SLACK x that estimate plus room for waits."""
        self.speed = speed
        if speed is None:
            return None
        estimate = self.estimate_s(planned)
        if not self.deadline_given:
            self.deadline_s = self.elapsed_s() + SLACK * estimate + DEADLINE_WAITS_S + self.timeout_s
        return estimate

    def estimate_s(self, planned: Iterable[PlannedRequest]) -> float:
        assert self.speed is not None
        total = 0.0
        for p in planned:
            if p.expect is Expect.REJECT:
                total += self.speed.overhead_s + p.prompt_tokens / UPLOAD_TOKENS_PER_S
            else:
                total += self.speed.expected_s(p.prompt_tokens, p.max_tokens, p.concurrent)
        return total

    # -- per request ---------------------------------------------------------------------------------
    def send(self, adapter: EngineAdapter, ids: list[int], *, max_tokens: int, stream: bool, timeout_s: float,
             extra: Mapping[str, Any] | None = None) -> Completion:
        """One request through `adapter`, counted in `cost`."""
        completion = adapter.complete(ids, max_tokens=max_tokens, stream=stream, timeout_s=timeout_s, extra=extra)
        self.cost.add(completion)
        return completion

    def natural_s(self, prompt_tokens: int, expect: Expect, *, max_tokens: int = 1, concurrent: int = 1) -> float:
        """The request's own budget, before the deadline cuts it."""
        speed = self.speed
        if expect is Expect.REJECT:
            fixed = SLACK * speed.overhead_s if speed else 0.0
            return self.timeout_s + fixed + concurrent * prompt_tokens / UPLOAD_TOKENS_PER_S
        if speed is None:
            return self.timeout_s + concurrent * prompt_tokens / self.fallback_tokens_per_second
        return self.timeout_s + SLACK * speed.expected_s(prompt_tokens, max_tokens, concurrent)

    def request_s(self, prompt_tokens: int, expect: Expect, *, max_tokens: int = 1, concurrent: int = 1) -> float:
        return max(0.0, min(self.natural_s(prompt_tokens, expect, max_tokens=max_tokens, concurrent=concurrent),
                            self.remaining_s()))

    def expected_note(self, prompt_tokens: int, expect: Expect, *, max_tokens: int = 1, concurrent: int = 1) -> str:
        """', expected about N s' from the measured speed (for the progress line), or ''."""
        if self.speed is None:
            return ""
        if expect is Expect.REJECT:
            seconds = self.speed.overhead_s
        else:
            seconds = self.speed.expected_s(prompt_tokens, max_tokens, concurrent)
        return f", expected about {seconds:.1f} s"

    def rate_note(self) -> str:
        if self.speed is None:
            return f"no speed was measured; the budget assumed {self.fallback_tokens_per_second:,.0f} prompt tokens/s"
        return f"budgeted from the measured speed: {self.speed.describe()}"

    # -- the whole run -----------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def remaining_s(self) -> float:
        return math.inf if self.deadline_s is None else self.deadline_s - self.elapsed_s()

    def wait_idle(self, state: EngineState, wanted_s: float) -> dict[str, bool | None]:
        """The bounded wait for idle pools, cut to what is left of the deadline. A run that stopped,
        or a wait the deadline cut short, proves nothing about idleness: {} (unknown), never "stuck"."""
        if not self.may_send():
            return {}
        idle = state.wait_idle(max(0.0, min(wanted_s, self.remaining_s())))
        return idle if self.may_send() else {}

    def enter(self, stage: str) -> None:
        self.stage = stage

    def may_send(self) -> bool:
        """False once the run stopped (an engine stopped answering, or the deadline passed)."""
        with self._lock:
            if self.stopped is None and self.remaining_s() <= 0:
                self.stopped = self._deadline_note()
            return self.stopped is None

    def probe(self, adapter: EngineAdapter, ids: list[int], *, name: str, expect: Expect, max_tokens: int,
              engines: Iterable[EngineAdapter], stream: bool = False, extra: Mapping[str, Any] | None = None,
              copies: int = 1, at_once: int | None = None,
              after_send: Callable[[], None] = lambda: None) -> tuple[Completion, ...] | None:
        """Send `copies` of one probe request at once, under its budget cut to the deadline.
        `at_once`: how many requests of this size the caller has in flight together, this one
        included (default `copies`); prefill serialises, so the budget counts them all.

        None when the run has stopped, or when the deadline cut the request short (it proves
        nothing; the run stops, naming the stage). `after_send` runs as soon as the answers are in
        (the caller's counter reading), before a stall decides what follows: a request that had to
        be refused and hangs ends the probing; any other stall asks whether the engine still
        answers (still_answering)."""
        if not self.may_send():
            return None
        natural = self.natural_s(len(ids), expect, max_tokens=max_tokens, concurrent=at_once or copies)
        timeout_s = max(0.0, min(natural, self.remaining_s()))

        def one() -> Completion:
            return self.send(adapter, ids, max_tokens=max_tokens, stream=stream, timeout_s=timeout_s, extra=extra)

        if copies == 1:
            completions: tuple[Completion, ...] = (one(),)
        else:
            with ThreadPoolExecutor(max_workers=copies) as pool:
                futures = [pool.submit(one) for _ in range(copies)]
                completions = tuple(f.result() for f in futures)
        after_send()
        if any(self.ended_by_deadline(c, natural) for c in completions):
            return None
        if any(c.timed_out for c in completions):
            if expect is Expect.REJECT:
                self.stop(f"the engine gave {name} no answer within its {natural:.0f}-s rejection budget (a hang, "
                          "not a rejection), so it was probed no further")
            else:
                still_answering(adapter, engines, self, after=name)
        return completions

    def ended_by_deadline(self, completion: Completion, natural_s: float | None = None) -> bool:
        """A request that was not served while the deadline ran out under it (its budget cut to
        what was left, perhaps to nothing): it proves nothing. With `natural_s` (the budget the
        request would have had), only a timeout the deadline made shorter than that counts. Stops
        the run, naming the stage."""
        if completion.served or self.remaining_s() > 0.05:
            return False
        if natural_s is not None and (not completion.timed_out or natural_s <= completion.elapsed_s + 0.05):
            return False
        self.stop(self._deadline_note())
        return True

    def stop(self, reason: str) -> None:
        with self._lock:
            if self.stopped is None:
                self.stopped = reason

    def stop_not_answering(self, reason: str) -> None:
        """Stop because the engine stopped answering."""
        with self._lock:
            if self.not_answering is None:
                self.not_answering = reason
        self.stop(reason)

    def _deadline_note(self) -> str:
        limit = f"{self.deadline_s:.0f} s" if self.deadline_s is not None else "the deadline"
        origin = "--deadline" if self.deadline_given else "the default deadline (3x the estimate)"
        return f"stopped at {origin} of {limit}, during {self.stage}"


def still_answering(entry: EngineAdapter, engines: Iterable[EngineAdapter], budget: Budget, *, after: str) -> bool:
    """After a request stalled: does the engine still answer a tiny one within --timeout? If not,
    it is probed no further (one clear inconclusive, not a timeout for every later probe)."""
    if not budget.may_send():
        return False
    try:
        ids = valid_token_ids(entry, engines, TINY_TOKENS, _fresh("liveness"))
    except EngineError as exc:
        budget.stop(f"after {after} stalled, no liveness request could be built ({exc}), so the engine was probed no further")
        return False
    reply = budget.send(entry, ids, max_tokens=1, stream=False, timeout_s=min(budget.timeout_s, budget.remaining_s()))
    if reply.served:
        return True
    if budget.ended_by_deadline(reply):  # the deadline cut it short: the engine's silence is not shown
        return False
    budget.stop_not_answering(f"after {after} stalled, {_unserved(reply, 'an 8-token request')}; the engine stopped answering, "
                "so it was probed no further")
    return False
