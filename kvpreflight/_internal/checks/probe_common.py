"""Helpers shared by the checks that read probe results."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.check_ids import CheckId
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight._internal.probes.results import DangerLine, Echo, ProbeResult, deltas_evidence
from kvpreflight.model import CheckResult, Completion, EngineSnapshot, ErrorKind, Hazard, Role, Status


def unreached(ctx: CheckContext, check_id: CheckId) -> list[CheckResult]:
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
        out.append(CheckResult(id=check_id, status=Status.INCONCLUSIVE,
                               message=f"no probe reached this {snap.role.value} engine (its request and token counters never moved); "
                               "check it directly with --endpoint and no --entry, or enable its metrics",
                               endpoint=snap.url))
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


def answered_elsewhere(p: ProbeResult, snapshots: Sequence[EngineSnapshot], entry_model: str | None = None) -> str | None:
    """Why an answer to this probe did not come from the checked engines (a gateway's fallback to
    another deployment), or None: the answer names a model none of them serves (nor the
    `entry_model` alias the request named), or every checked engine's counters were read and no
    prompt-token counter moved."""
    c = p.completion
    if c.status != 200 or not (c.text or c.completion_tokens):
        return None
    said = []
    served = {s.model for s in snapshots if s.model}
    if c.answer_model is not None and served and c.answer_model not in served | {entry_model}:
        said.append(f"the answer names model {c.answer_model!r}, which the checked engine(s) do not serve "
                    f"({', '.join(sorted(served))})")
    counted = [p.counter_deltas[s.url].prompt_tokens for s in snapshots if s.url in p.counter_deltas]
    # None moved at all (a shortened prompt moves them by less: that is truncation, said elsewhere).
    if snapshots and len(counted) == len(snapshots) and all(v == 0 for v in counted):  # None: not read
        said.append(f"no checked engine's prompt-token counter moved for the {c.sent_tokens:,} tokens sent")
    if not said:
        return None
    return "answered by another model or deployment, not the checked engine(s) (a gateway's fallback): " + "; ".join(said)


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
        ev["counter_deltas"] = deltas_evidence(p.counter_deltas)
    if p.earlier_windows:  # the tries it was sent again after (a decode's counters moved in their windows)
        ev["earlier_windows"] = [deltas_evidence(w) for w in p.earlier_windows]
    if p.foreign_markers:
        ev["foreign_markers"] = list(p.foreign_markers)
    if p.echo.own is not None:
        ev.update(echo_evidence(p.echo))
    return ev


def decode_urls(ctx: CheckContext) -> set[str]:
    return {s.url for s in ctx.snapshots if s.role is Role.DECODE}


SEVERITY = (Status.FAIL, Status.INCONCLUSIVE, Status.WARN, Status.PASS, Status.SKIP)


def worst_status(statuses: Iterable[Status]) -> Status:
    return min(statuses, key=SEVERITY.index)


def danger_entry(line: DangerLine, when: str) -> dict[str, Any]:
    out: dict[str, Any] = {"source": line.source, "what": line.what, "request_id": line.request_id, "when": when,
                           "hazard": line.hazard.value}
    if line.detail is not None:
        out["detail"] = line.detail
    return out if line.names is None else {**out, "names": line.names}


def logged_lines(dangers: Sequence[Mapping[str, Any]]) -> str:
    """The danger lines as the message quotes them: one entry per signal and moment, counted."""
    if not dangers:
        return ""
    counted: dict[tuple[str, str, str], int] = {}
    for d in dangers:
        when = d["when"] + (f", naming {d['names']}" if d.get("names") else "")
        key = (d["source"], d["what"] + (f" ({d['detail']})" if d.get("detail") else ""), when)
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


def of_hazard(dangers: Sequence[Mapping[str, Any]], hazard: Hazard) -> list[Mapping[str, Any]]:
    return [d for d in dangers if d.get("hazard") == hazard.value]


# What a deployment changes when its decode reads KV after the prefill's lease ran out.
LEASE_FIX = ("raise kv_connector_extra_config.kv_lease_duration in the prefill's --kv-transfer-config and size its KV pool "
             "for the KV each request pins that long (a client that disconnects first pins it for the whole lease); on vLLM "
             "builds before the lease, raise VLLM_NIXL_ABORT_REQUEST_TIMEOUT")
# vLLM's prefill counts a late read once per notification, i.e. per decode rank, not per request.
LATE_READ_MEANING = ("a decode read KV its prefill had already released (the KV lease ran out first), and the request was "
                     "answered anyway: the client got HTTP 200 with text computed from pages that may by then hold another "
                     "request's KV")
# The incident's class, reached through a disconnect: KV freed on the abort while a transfer still read it.
CANCEL_PATH_MEANING = ("a decode read KV of a request its client had abandoned after the prefill freed it on the abort: the "
                       "cancel path frees KV under a transfer in flight (the incident's class); nothing read was served here")
EXPIRY_COST = ("the prefill released KV no decode had read within its lease: a decode that still wanted it recomputes the "
               "prompt (a second prefill, in TTFT and compute), and until then the pages were pinned")


def lease_in_force(snapshots: Sequence[EngineSnapshot]) -> str:
    """The prefills' KV lease as a message quotes it."""
    said = []
    for s in snapshots:
        if s.kv_lease is None or s.role is Role.DECODE:
            continue
        how = f"stated in {s.kv_lease.stated_in}" if s.kv_lease.stated else "the engine's default; the setting was not in its start-up log"
        said.append(f"{s.kv_lease.setting} {s.kv_lease.seconds:g} s at {s.url} ({how})")
    return "the lease in force: " + ("; ".join(said) if said else "not read (give the prefill's log with --log to read it)")


def late_read_finding(late: Sequence[Mapping[str, Any]], counted: Sequence[tuple[str, int, str]],
                      snapshots: Sequence[EngineSnapshot], meaning: str = LATE_READ_MEANING) -> str | None:
    """A failure's message for late reads (log lines, counted reads), or None when there were none."""
    if not late and not counted:
        return None
    return f"{meaning}{logged_lines(late)}{counted_stale_reads(counted)}; {lease_in_force(snapshots)}; fix: {LEASE_FIX}"


# SGLang's in-engine KV canary (--kv-canary log|raise): a slot's sidecar did not match on read.
CANARY_MEANING = ("the engine's own KV canary found KV slots not holding what was written for the request reading them "
                  "(another request's KV, or a page freed and reused under it)")


def canary_finding(violations: Sequence[Mapping[str, Any]]) -> str | None:
    return None if not violations else f"{CANARY_MEANING}{logged_lines(violations)}"


def outlived_deadlines(snapshots: Sequence[EngineSnapshot], near_context_s: float | None,
                       max_accepted: int | None, *, measured: str | None = None,
                       at_least_s: float = 0.0) -> tuple[list[str], list[str]]:
    """KV handoff deadlines (vLLM's lease, SGLang's PD timeouts) shorter than what one prompt at
    the limit takes (`measured`: how it went when it was sent and timed, e.g. "was answered in
    3.3 s"; else the measured speed predicts it): every prompt that long outlives them; only
    deadlines of `at_least_s` or more. Returns (stated: a failure, the engine's unstated default: a
    warning)."""
    stated: list[str] = []
    assumed: list[str] = []
    if near_context_s is None:
        return stated, assumed
    for s in snapshots:
        for d in s.kv_deadlines():
            if d.seconds >= near_context_s or d.seconds < at_least_s:
                continue
            took = (f"{measured} (sent and timed)" if measured
                    else f"takes about {near_context_s:.1f} s at the measured speed")
            said = (f"a prompt of {max_accepted:,} tokens {took}, longer than "
                    f"{d.setting} {d.seconds:g} s at {s.url}" + ("" if d.stated else " (its default: the setting was not stated)")
                    + f": every prompt that long outlives it; raise {d.setting} above the longest prompt's time, and size the "
                    "pool for the KV a request pins that long")
            (stated if d.stated else assumed).append(said)
    return stated, assumed


def expiry_finding(expired: Sequence[Mapping[str, Any]], counted: Sequence[tuple[str, int, str]]) -> str | None:
    if not expired and not counted:
        return None
    said = "; ".join(f"{url} counted {n} request(s) whose KV lease ran out unread ({when})" for url, n, when in counted)
    return f"{EXPIRY_COST}{logged_lines(expired)}" + (f"; the counters say: {said}" if said else "")


# -- each answer judged on its own: did it come from its own prompt? ------------------------------

# A head repeated from a prompt at least this long shows an echo that reaches the prompt's start
# (the builtin engine's copy head), not one that copies from a few positions back (the echo model
# for vLLM and llama.cpp repeats the token 38 back: a short prompt's head is within its reach).
LONG_RANGE_MIN_TOKENS = 256
NOT_FROM_PROMPT_MEANING = ("while the same model repeated its own prompt in other answers of this run: the answer was "
                           "computed from other KV than its prompt's (stale pages, another request's KV, a placeholder in "
                           "the prompt's place: the incident's class), so it may hold another customer's data; nothing of it "
                           "is quoted")
WINDOW_MEANING = ("while shorter prompts' answers repeated their head: the engine attended only to a window at the prompt's "
                  "end (an attention window clamped below the served context, or positions past the model's), so every "
                  "token was counted but not every token was read; serve a context the model attends to in full (TensorRT-LLM: "
                  "--fail_fast_on_attention_window_too_large; never override the model's positions)")


@dataclass(frozen=True)
class EchoScope:
    """What this run's answers showed of the model: it repeats its prompt (`echoes`), and from
    the prompt's very start (`long_range`). Only then is an answer that does not owed to the run."""

    echoes: bool
    long_range: bool

    @classmethod
    def of(cls, ctx: CheckContext) -> EchoScope:
        echoes = [p.echo for p in ctx.probes.probes if p.completion.served] if ctx.probes else []
        if ctx.isolation is not None:
            echoes += [r.echo for r in ctx.isolation.requests() if r.served and r.scanned]
        return cls(echoes=any(e.own for e in echoes),
                   long_range=any(e.head and e.sent_tokens >= LONG_RANGE_MIN_TOKENS for e in echoes))

    def not_from_prompt(self, echo: Echo, what: str) -> str | None:
        """Why `what` (an answer to a served, scanned request) did not come from its own prompt,
        or None: it repeats nothing of it where the model echoes."""
        if not self.echoes or echo.own is not False:
            return None
        return (f"the engine answered {what} ({echo.sent_tokens:,} tokens) with text that is not from it ({echo.chars:,} "
                f"characters, sha256 {echo.sha256[:16]}) {NOT_FROM_PROMPT_MEANING}")

    def window_only(self, echo: Echo, what: str) -> str | None:
        """Why `what` was read only in part: its answer repeats its prompt but not the head it began
        with, where the model echoes from a prompt's start. None otherwise."""
        if not self.long_range or not echo.own or echo.head is not False:
            return None
        return f"the answer to {what} ({echo.sent_tokens:,} tokens) repeated its prompt's end but not its head, {WINDOW_MEANING}"


def echo_evidence(echo: Echo) -> dict[str, Any]:
    return {"own_prompt_repeated": echo.own, **({"head_repeated": echo.head} if echo.head is not None else {}),
            **echo.evidence()}
