"""Canaries: two synthetic tenants, a few short requests each round (streamed and not), each
carrying a canary fresh this round; every answer is scanned for the other tenant's canary with
the isolation probes' scanner (probes/markers.py). Requests are marked synthetic by a header and
the request's `user` field, so gateways and billing can leave them out. Never disruptive: no
disconnect, no load, no prompt above a small fraction of the context."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.probes.markers import contains_marker, foreign_markers, new_marker
from kvpreflight._internal.probes.results import Limits, Tenant
from kvpreflight._internal.probes.tenants import TenantClient
from kvpreflight._internal.probes.tokens import valid_token_ids
from kvpreflight._internal.session import Connection
from kvpreflight._internal.watch.findings import Finding, FindingKind
from kvpreflight.model import Completion

SYNTHETIC_HEADER = "X-Kvpreflight-Synthetic"  # value: watch; gateways and billing can exclude these requests
SYNTHETIC_VALUE = "watch"
CONTEXT_FRACTION = 0.05  # a canary prompt is at most this share of the served context
MAX_PROMPT_TOKENS = 160  # and never longer than this (two of the builtin engine's 128-token transfer batches)
MIN_PROMPT_TOKENS = 48  # shorter cannot hold a canary (~38 tokens on a byte tokenizer)
# Each answer is as long as its prompt: stale KV anywhere under the prompt (a lost transfer
# batch, another tenant's tail) can only show in an answer that reaches that far.
A, B = Tenant.A, Tenant.B
# (tenant, streamed): interleaved, so one tenant's freed pages are the next request's to reuse.
ORDER: tuple[tuple[Tenant, bool], ...] = ((A, False), (B, False), (A, True), (B, True))
REQUESTS_PER_ROUND = len(ORDER)


def synthetic_user(tenant: Tenant | None) -> str:
    """The request's `user` field: says the request is kvpreflight's, never a person's (None: a
    full round's capacity request, which no tenant sends)."""
    return f"kvpreflight-watch-synthetic-{tenant.value if tenant else 'full'}"


def prompt_tokens(limits: Limits) -> int | None:
    """The canary prompt's length for these limits; None when not even the shortest fits."""
    room = min(int(limits.served_context * CONTEXT_FRACTION), MAX_PROMPT_TOKENS, limits.max_accepted,
               (limits.served_context - 1) // 2)
    return room if room >= MIN_PROMPT_TOKENS else None


@dataclass(frozen=True, kw_only=True)
class CanarySettings:
    connection: Connection  # the session's: headers, TLS, timeout (each tenant adds its own credentials)
    tenant_headers: tuple[Mapping[str, str], Mapping[str, str]] = ({}, {})  # the tenants' own credentials
    salted: bool = True  # send a fresh cache_salt per tenant (the deployment does not bind tenants itself)

    @property
    def timeout_s(self) -> float:
        return self.connection.timeout_s


@dataclass(frozen=True, kw_only=True)
class CanaryResult:
    findings: tuple[Finding, ...] = ()
    requests: int = 0
    prompt_tokens: int = 0
    throttled: bool = False  # the entry answered HTTP 429: the round stops sending
    retry_after_s: float | None = None
    not_measured: tuple[str, ...] = ()
    cut_short: bool = False


def canary_round(entry: EngineAdapter, engines: Sequence[EngineAdapter], limits: Limits, settings: CanarySettings,
                 stop: threading.Event, on_sent: Callable[[int], None] = lambda _: None) -> CanaryResult:
    """Send this round's canary requests through `entry`, tenant A and B interleaved; stop at the
    first 429 (throttled, not failed) or when `stop` is set. `on_sent(tokens)` is told each send."""
    tokens = prompt_tokens(limits)
    if tokens is None:
        return CanaryResult(not_measured=(f"canaries: the served context ({limits.served_context:,} tokens) leaves no room "
                                          f"for a {MIN_PROMPT_TOKENS}-token canary prompt",))
    canaries = {t: new_marker(f"TENANT{t.label}") for t in Tenant}  # fresh every round
    findings: list[Finding] = []
    served: set[Tenant] = set()
    echoed: set[Tenant] = set()  # tenants whose own canary came back in a served answer
    sent = submitted = 0
    with ExitStack() as opened:
        tenants = {}
        for tenant, own in zip(Tenant, settings.tenant_headers, strict=True):
            headers = {**settings.connection.headers, **own, SYNTHETIC_HEADER: SYNTHETIC_VALUE}
            http = settings.connection.client({**own, SYNTHETIC_HEADER: SYNTHETIC_VALUE})
            opened.callback(http.close)
            salt = f"kvpreflight-watch-{tenant.value}-{secrets.token_hex(8)}" if settings.salted else None
            tenants[tenant] = TenantClient(tenant=tenant, adapter=entry.with_client(http), headers=headers, salt=salt)
        try:
            ids = {t: valid_token_ids(tenants[t].adapter, engines, tokens, f"{canaries[t]} ") for t in Tenant}
        except EngineError as exc:
            return CanaryResult(not_measured=(f"canaries: the canary prompts could not be tokenized: {exc}",))
        for tenant, streamed in ORDER:
            if stop.is_set():
                return CanaryResult(findings=tuple(findings), requests=sent, prompt_tokens=submitted, cut_short=True)
            client = tenants[tenant]
            extra = {**(client.extra or {}), "user": synthetic_user(tenant)}
            on_sent(tokens)
            completion = client.adapter.complete(ids[tenant], max_tokens=tokens, stream=streamed,
                                                 timeout_s=settings.timeout_s, extra=extra)
            sent, submitted = sent + 1, submitted + tokens
            if completion.status == 429:
                return CanaryResult(findings=tuple(findings), requests=sent, prompt_tokens=submitted, throttled=True,
                                    retry_after_s=completion.retry_after_s)
            findings.extend(_scan(entry.url, tenant, streamed, completion, canaries))
            if completion.served:
                served.add(tenant)
                if own_canary_seen(completion, canaries[tenant]):
                    echoed.add(tenant)
    # Fail closed, as tenant-isolation does: a model that does not repeat a tenant's own canary back
    # could not have shown the other tenant's either, so those answers measured nothing (a request
    # not served is a finding already).
    silent = [t for t in Tenant if t in served and t not in echoed]
    missing = (f"canaries: no served answer of tenant {' or '.join(t.label for t in silent)} repeated its own canary "
               "(the model does not echo), so a missing foreign canary proves nothing",) if silent else ()
    return CanaryResult(findings=tuple(findings), requests=sent, prompt_tokens=submitted, not_measured=missing)


def _scan(url: str, tenant: Tenant, streamed: bool, completion: Completion, canaries: Mapping[Tenant, str]) -> list[Finding]:
    kind = "streamed" if streamed else "not streamed"
    who = f"tenant {tenant.label}'s canary request ({kind})"
    if not completion.served:
        why = completion.error_message or completion.transport_error or (
            "timed out" if completion.timed_out else f"HTTP {completion.status}")
        return [Finding(kind=FindingKind.CANARY, what="request-failed", endpoint=url,
                        message=f"{url}: {who} was not served: {why}", found=completion.status)]
    own, other = canaries[tenant], canaries[tenant.other]
    crossed = foreign_markers(completion.text, {own}, {other})
    if not crossed:
        return []
    # Only marker strings travel on (never the answer's text): both are this round's own.
    return [Finding(kind=FindingKind.CANARY, what="crossing", endpoint=url,
                    message=f"{url}: the answer to {who} held tenant {tenant.other.label}'s canary ({', '.join(crossed)})",
                    found=list(crossed))]


def own_canary_seen(completion: Completion, canary: str) -> bool:
    """The positive control: the tenant's own canary came back (an echoing model repeats it)."""
    return contains_marker(completion.text, canary)
