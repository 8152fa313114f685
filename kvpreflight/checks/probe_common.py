"""Helpers shared by the checks that read probe results."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvpreflight.checks.interface import CheckContext
from kvpreflight.model import CheckResult, Completion, ErrorKind, Role, Status
from kvpreflight.probes.results import DangerLine, ProbeResult


def unreached(ctx: CheckContext, check_id: str) -> list[CheckResult]:
    """Engines that no probe reached: nothing about them was proved by the probes."""
    run = ctx.probes
    if run is None or run.not_run or not run.probes:
        return []
    reached = {url for p in run.probes for url in p.reached}
    out = []
    for snap in ctx.snapshots:
        if snap.url in reached:
            continue
        if ctx.entry is None or ctx.entry.rstrip("/") == snap.url:
            continue  # the probes were sent to this engine itself
        out.append(CheckResult(check_id, Status.INCONCLUSIVE,
                               f"no probe reached this {snap.role.value} engine (its request and token counters never moved); "
                               "check it directly with --endpoint and no --entry, or enable its metrics",
                               snap.url))
    return out


def refusal_verdict(c: Completion) -> tuple[Status, str]:
    """How a request that must be refused was answered."""
    if c.timed_out:
        return Status.FAIL, f"no answer within the timeout ({c.elapsed_s:.1f}s): a hang, not a rejection"
    if c.malformed is not None:  # what came before the bad part was served; the rest is not believed
        if c.completion_tokens:
            return Status.FAIL, (f"HTTP {c.status}: {c.completion_tokens} tokens were served before a part of the reply "
                                 f"that does not read ({c.malformed}): the over-capacity request was served, not rejected")
        if c.text:
            return Status.FAIL, (f"HTTP {c.status}: an answer with text, its counts not readable ({c.malformed}): "
                                 "the over-capacity request was served, not rejected")
        return Status.INCONCLUSIVE, f"HTTP {c.status}: a reply that does not read, nothing measured from it: {c.malformed}"
    if c.transport_error:
        if c.completion_tokens:  # tokens before the break: the engine was answering it
            return Status.FAIL, (f"HTTP {c.status}: {c.completion_tokens} tokens were generated before the connection broke "
                                 f"({c.transport_error}): the over-capacity request was served, not rejected")
        return Status.INCONCLUSIVE, f"transport failure, nothing measured: {c.transport_error}"
    if c.status is not None and c.status >= 500:
        return Status.FAIL, f"HTTP {c.status} (server error, not a clean rejection): {c.error_message or ''}".rstrip(": ")
    if c.empty_body:
        return Status.FAIL, f"HTTP {c.status} with an empty body: the over-capacity request was served, not rejected"
    if c.error_message is not None:
        if c.completion_tokens:
            return Status.FAIL, f"error reported but {c.completion_tokens} tokens were generated"
        if c.error_kind is ErrorKind.LENGTH:
            where = "inside an HTTP 200 stream" if c.status == 200 else f"HTTP {c.status}"
            return Status.PASS, f"refused for length ({where}), zero tokens generated"
        if c.error_kind is ErrorKind.VOCAB:
            return Status.INCONCLUSIVE, f"refused as out-of-vocabulary, not for length (HTTP {c.status}): not a capacity verdict"
        if c.status == 200:  # an answer that ended without a length error is never a rejection
            return Status.FAIL, (f"HTTP 200 ending in {c.finish_reason or 'an error'} ({c.error_message}), not a length error: "
                                 "the over-capacity request was served, not rejected")
        return Status.INCONCLUSIVE, f"refused, but not for length (HTTP {c.status}): {c.error_message}"
    if c.truncated or (c.prompt_tokens is not None and c.prompt_tokens < c.sent_tokens):
        return Status.FAIL, (f"HTTP {c.status}: the prompt was silently truncated "
                             f"(engine processed {c.prompt_tokens} of {c.sent_tokens} tokens)")
    finish = f" (finish_reason {c.finish_reason})" if c.finish_reason else ""
    return Status.FAIL, (f"HTTP {c.status} with {c.completion_tokens if c.completion_tokens is not None else 'an unknown number of'} "
                         f"generated tokens{finish}: the over-capacity request was served, not rejected")


def accepted(c: Completion) -> bool:
    """Taken on and answered: served cleanly, or answered with text in a reply whose counts do
    not read (a bad count voids the counts, not the answer)."""
    return c.served or (c.malformed is not None and c.status == 200 and bool(c.text or c.completion_tokens))


def not_served(c: Completion) -> str:
    """Why a request that had to be served was not, in a few words."""
    if c.empty_body:
        return f"HTTP {c.status} with an empty body"
    if c.error_message is not None and c.completion_tokens:
        return f"HTTP {c.status}: an error after {c.completion_tokens} generated tokens: {c.error_message}"
    if c.error_message is None:  # an answer without a token
        return f"HTTP {c.status} without a generated token" + (f", finish_reason {c.finish_reason}" if c.finish_reason else "")
    return f"HTTP {c.status}: {c.error_message}"


def stalled_or_broken(c: Completion, speed_note: str = "") -> str | None:
    """What left a request that had to be served without an answer (a stall, a broken connection),
    or None when it was answered. Nothing is measured from it: inconclusive, never a failure (slow
    is not wrong). `speed_note` says how the budget was set (the engine's measured speed)."""
    if c.timed_out:
        how = f"; {speed_note}" if speed_note else ""
        return f"stalled: no complete answer within its {c.elapsed_s:.1f}s budget{how}, nothing measured"
    if c.transport_error:
        return f"the connection broke, nothing measured: {c.transport_error}"
    if c.malformed is not None:
        return f"the reply does not read, nothing measured from it: {c.malformed}"
    return None


def probe_evidence(p: ProbeResult) -> dict[str, Any]:
    ev = {"probe": p.name, "purpose": p.purpose, **p.completion.evidence()}
    if p.reached:
        ev["reached"] = list(p.reached)
    if p.counter_deltas:
        ev["counter_deltas"] = {u: dict(d) for u, d in p.counter_deltas.items()}
    if p.foreign_markers:
        ev["foreign_markers"] = list(p.foreign_markers)
    return ev


def decode_urls(ctx: CheckContext) -> set[str]:
    return {s.url for s in ctx.snapshots if s.role is Role.DECODE}


SEVERITY = (Status.FAIL, Status.INCONCLUSIVE, Status.WARN, Status.PASS, Status.SKIP)


def worst_status(statuses: Iterable[Status]) -> Status:
    return min(statuses, key=SEVERITY.index)


def danger_entry(line: DangerLine, when: str) -> dict[str, Any]:
    out: dict[str, Any] = {"source": line.source, "what": line.what, "request_id": line.request_id, "when": when}
    return out if line.names is None else {**out, "names": line.names}


def logged_lines(dangers: Sequence[Mapping[str, Any]]) -> str:
    """The danger lines as the message quotes them: one entry per signal and moment, counted."""
    if not dangers:
        return ""
    counted: dict[tuple[str, str, str], int] = {}
    for d in dangers:
        when = d["when"] + (f", naming {d['names']}" if d.get("names") else "")
        key = (d["source"], d["what"], when)
        counted[key] = counted.get(key, 0) + 1
    return "; the logs say: " + "; ".join(f"{source} log: \"{what}\" {'x' + str(n) + ' ' if n > 1 else ''}({when})"
                                          for (source, what, when), n in counted.items())


def counted_stale_reads(counted: Sequence[tuple[str, int, str]]) -> str:
    """(engine url, reads, when) as the message quotes them."""
    if not counted:
        return ""
    return "; the counters say: " + "; ".join(
        f"a decode read {n} request(s)' KV that {url} no longer held, so those pages may have been reused ({when})"
        for url, n, when in counted)
