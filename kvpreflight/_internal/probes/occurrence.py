"""How an isolation scenario is shown to have happened as intended (its Evidence,
probes/scenarios.py), from what the prober recorded: the requests, their departures, the
engines' counter deltas. Pure functions: the prober (probes/isolation.py) calls them."""

from __future__ import annotations

from dataclasses import replace

from kvpreflight._internal.probes.disconnect import AFTER_FIRST_TOKEN
from kvpreflight._internal.probes.results import Scenario
from kvpreflight._internal.probes.scenarios import ScenarioSpec
from kvpreflight.model import CounterField, Hazard


def left_mid_transfer(scenario: Scenario, *, pd: bool, deferred: tuple[float | None, float | None],
                      notes: list[str]) -> Scenario:
    """cancel-transfer: a decode's deferred-release counter that moved (before, after), the
    crossing itself, or on a unified engine the disconnect during prefill (prefill_cancel_shown)."""
    deferred_before, deferred_after = deferred
    occurred: bool | None
    if deferred_before is not None and deferred_after is not None and deferred_after > deferred_before:
        how = (f"confirmed: decode deferred {int(deferred_after - deferred_before)} release(s) until the "
               "transfer drained (its deferred-release counter moved), so the disconnect landed mid-transfer")
        occurred = True
    elif any(r.crossings for r in scenario.requests):
        how, occurred = "confirmed by the canary crossing itself", True
    elif not pd:
        how, occurred = prefill_cancel_shown(scenario)
    else:
        how, occurred = ("unconfirmed: no deferred-release counter moved and no page log is reachable over HTTP, so the "
                         "disconnect cannot be shown to have landed while KV was being written"), None
    if notes:
        how += "; " + "; ".join(notes)
    moot = None if pd else "a disconnect mid-transfer: a unified engine moves no KV between engines"
    return replace(scenario, occurred=occurred, occurrence=how, not_applicable=moot)


def left_after_token(scenario: Scenario, notes: list[str]) -> Scenario:
    """cancel-decode: each disconnect came after a streamed token."""
    left = [r for r in scenario.requests if r.abandoned]
    occurred: bool | None
    if left and all(r.abandoned == AFTER_FIRST_TOKEN for r in left):
        how, occurred = "confirmed: each disconnect came after a streamed token and before the answer ended", True
    else:
        how, occurred = "unconfirmed: " + ("; ".join(notes) or "no streamed token arrived before the disconnect"), None
    return replace(scenario, occurred=occurred, occurrence=how)


def pool_filled(scenario: Scenario, spec: ScenarioSpec, min_pool: int | None) -> Scenario:
    """load: the requests' KV held at once against the smallest pool."""
    held_at_once = [r for step in spec.steps for r in step.requests]
    total = sum(r.prompt_tokens + r.max_tokens for r in held_at_once)
    first = held_at_once[0]
    occurred: bool | None
    held = f"{len(held_at_once)} x ({first.prompt_tokens:,} prompt + {first.max_tokens:,} answer) = {total:,} tokens"
    if min_pool is not None and total >= 0.8 * min_pool:
        how, occurred = f"requests at once: {held} against a {min_pool:,}-token pool", True
    else:
        how = f"unconfirmed: bounded to {held}, " + (
            f"below 80% of the {min_pool:,}-token pool" if min_pool else "the pool size is unknown")
        occurred = None
    return replace(scenario, occurred=occurred, occurrence=how)


def read_after_lease(scenario: Scenario, decode_leg: str, *, after_s: float, lease_said: str, notes: list[str]) -> Scenario:
    """late-decode: the decode leg (`decode_leg`, tenant A's) answered after the prefill's lease,
    with what the prefill counted and logged, and whether the echo still held A's canary."""
    decode = [r for r in scenario.requests if r.name == decode_leg]
    stale = sum(d.stale_kv_reads or 0 for d in scenario.counter_deltas.values())
    logged = sum(1 for d in scenario.danger_lines if d.hazard is Hazard.LATE_READ)
    occurred: bool | None
    if decode and decode[0].served:
        late = (f"the prefill counted {stale:.0f} late read(s) and logged {logged}" if stale or logged
                else "the prefill counted and logged no late read")
        # the echo repeats whatever KV the decode read: A's own canary missing says the pages changed
        echo = ("A's answer repeated A's own canary" if decode[0].own_seen
                else "A's answer did not repeat A's own canary (the pages read no longer held A's prompt)")
        how, occurred = (f"confirmed: the decode leg went {after_s:.1f} s after the prefill leg's answer, past the "
                         f"lease ({lease_said}); {late}; {echo}"), True
    else:
        how, occurred = "unconfirmed: " + ("; ".join(notes) or "the decode leg was not answered"), None
    if notes and occurred:
        how += "; " + "; ".join(notes)
    return replace(scenario, occurred=occurred, occurrence=how)


def prefill_cancel_shown(scenario: Scenario) -> tuple[str, bool | None]:
    """A unified engine moves no KV, so a disconnect mid-transfer does not apply there; what does
    is a disconnect during prefill. Its generated-token counter must have moved by exactly the
    answers the others got (not one token for the abandoned requests), and the engine must show
    that it had taken each abandoned request up: by counting an abort for each (SGLang, the
    builtin engine), or, where a client's disconnect is never counted (vLLM), by its scheduler
    having taken up every prompt sent (scheduled prompt tokens) while it finished none of the
    abandoned requests (finished requests moved by exactly the answered ones). A counter counts
    only where every engine read reports it: an abandoned request may have gone to any of them."""
    deltas = list(scenario.counter_deltas.values())

    def total(name: CounterField) -> float | None:
        known = [v for d in deltas if (v := d.get(name)) is not None]
        return sum(known) if deltas and len(known) == len(deltas) else None

    left = [r for r in scenario.requests if r.abandoned]
    if not left:
        return "unconfirmed: no client left", None
    generated, aborted = total(CounterField.GENERATION_TOKENS), total(CounterField.ABORTED_REQUESTS)
    if generated is None:
        counts = "no aborted requests" if aborted is None else "no generated tokens"
        return f"unconfirmed: the engine counts {counts}, so a disconnect during prefill cannot be shown", None
    answered = sum((r.completion.completion_tokens or 0) for r in scenario.requests if r.completion is not None)
    if extra := generated - answered:
        return (f"unconfirmed: the engine generated {extra:.0f} token(s) beyond the answers the others got, so the "
                f"{len(left)} disconnect(s) did not all land during prefill"), None
    if aborted is not None and aborted >= len(left):
        return (f"confirmed: the engine counted {aborted:.0f} aborted request(s) for the {len(left)} that left, with no "
                "token generated for them (generated tokens moved by exactly the answers the others got), so each "
                "disconnect landed during prefill"), True
    scheduled, finished = total(CounterField.SCHEDULED_PROMPT_TOKENS), total(CounterField.REQUESTS)
    if scheduled is not None and finished is not None:
        served = [r.completion for r in scenario.requests if r.completion is not None and r.completion.served]
        abandoned = sum(r.abandoned_tokens for r in left)
        sent = sum(c.sent_tokens for c in served) + abandoned
        if scheduled >= sent and finished == len(served):
            return (f"confirmed: the engine's scheduler took up {scheduled:,.0f} prompt tokens (every prompt sent, the "
                    f"{len(left)} abandoned ones' {abandoned:,} included), it finished none of the {len(left)} whose "
                    "clients left and generated no token for them, so each disconnect landed during prefill"), True
        return (f"unconfirmed: the engine's scheduler took up {scheduled:,.0f} of the {sent:,} prompt tokens sent and it "
                f"finished {finished:.0f} request(s) for the {len(served)} answered, so the {len(left)} disconnect(s) "
                "cannot all be shown to have landed during prefill"), None
    if aborted is not None:
        return f"unconfirmed: the engine counted {aborted:.0f} aborted request(s) for the {len(left)} that left", None
    return ("unconfirmed: the engine counts neither aborted requests nor the prompts its scheduler takes up, so a "
            "disconnect during prefill cannot be shown"), None
