"""The two-tenant isolation probes: synthetic tenants A and B, each with a fresh canary, sent
through the entry in scenarios interleaved so that one tenant's KV pages are freed right before
the other tenant's requests reuse them. Every response is scanned for the other tenant's canary
(whole or a fragment) and for any other synthetic marker. The prober records; it never judges.

Scenarios (the incident's paths, issue 4):
  normal         long prompts, A B A B A B (a lost transfer shows the previous tenant's pages)
  boundary       the longest prompt the limits accept (minus room for the scanned answer)
  over-capacity  A long, then B over the pool/context (the incident path), and mirrored
  cancel-transfer  (churn) A disconnects while its KV is being written, then B's requests take
                 the freed pages; mirrored
  cancel-decode  (churn) A disconnects after its first streamed token, then B; mirrored
  load           (churn) A and B at once, near the smallest pool

plus the prefix-cache controls: cold, same-tenant warm (must hit), cross-tenant (must not).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import secrets
import socket
import ssl
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

from kvpreflight.engines.errors import EngineError
from kvpreflight.engines.interface import Completion, EngineAdapter, metric_sum
from kvpreflight.model import EngineSnapshot, Role
from kvpreflight.probes.capacity import Limits
from kvpreflight.probes.tokens import valid_token_ids
from kvpreflight.probes.markers import FRAGMENT_MIN, foreign_markers, new_marker

TENANTS = ("a", "b")
SCAN_MAX_TOKENS = 256  # answers long enough to reach past a lost first transfer batch
CANCEL_DECODE_MAX_TOKENS = 512
CACHE_PREFIXES = 3  # fresh shared prefixes for the prefix-cache controls (medians of TTFT)
MAX_LOAD_REQUESTS = 8
IDLE_WAIT_S = 12.0  # a cancelled bootstrap may hold pages ~10 s on SGLang-like engines
CANCEL_PROPAGATION_S = 0.06  # router and decode notice a closed socket within ~40 ms
TRANSFER_START_WAIT_S = 2.0  # then leave anyway (the scenario is reported unconfirmed)
UNIFIED_CANCEL_AFTER_S = 0.02
# Metric names read for lifecycle and cache evidence (engines.md; the builtin engine's own names).
TRANSFER_FAILED = ("sglang:num_transfer_failed_reqs_total",)
BOOTSTRAP_FAILED = ("sglang:num_bootstrap_failed_reqs_total",)
DEFERRED_RELEASE = ("sglang:decode_deferred_kv_release_total",)
CACHE_HITS = ("vllm:prefix_cache_hits_total", "sglang:prefix_cache_hits_total", "sglang:cached_tokens_total")

CHURN_SCENARIOS = ("cancel-transfer", "cancel-decode", "load")


@dataclass(frozen=True)
class TenantRequest:
    """One request of one tenant and what its answer contained (markers only, never text)."""

    tenant: str  # "a" | "b"
    name: str  # e.g. normal-a1
    completion: Completion | None  # None: we disconnected on purpose (see `abandoned`)
    expect: str = "accept"  # accept | reject
    abandoned: str | None = None  # how we disconnected ("after transfer start", "after first token", ...)
    own_seen: bool = False  # the tenant's own canary surfaced (positive control)
    crossings: tuple[str, ...] = ()  # the other tenant's canary, fragments, other synthetic markers

    @property
    def served(self) -> bool:
        c = self.completion
        return c is not None and c.status == 200 and c.error_message is None and not c.timed_out and not c.transport_error


@dataclass(frozen=True)
class Scenario:
    name: str
    purpose: str
    requests: tuple[TenantRequest, ...] = ()
    skipped: str | None = None  # why it did not run
    occurred: bool | None = None  # True: shown to have happened; None: unconfirmed
    occurrence: str = ""  # how it was shown, or why it could not be
    idle_after: Mapping[str, bool | None] = field(default_factory=dict)
    counter_deltas: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    churn: bool = False


@dataclass(frozen=True)
class CacheProbe:
    kind: str  # cold | warm | cross
    tenant: str
    prefix: int  # which fresh prefix
    completion: Completion
    hit_metric_delta: float | None = None  # engines' prefix-cache hit counters over this request

    @property
    def ttft_s(self) -> float:
        c = self.completion
        return c.ttft_s if c.ttft_s is not None else c.elapsed_s


@dataclass(frozen=True)
class PrefixCacheRun:
    probes: tuple[CacheProbe, ...] = ()
    binding: str = ""
    caching_off: str | None = None  # the engine states prefix caching is off (and where)
    not_run: str | None = None
    prompt_tokens: int = 0

    def of(self, kind: str) -> list[CacheProbe]:
        return [p for p in self.probes if p.kind == kind]


@dataclass(frozen=True)
class IsolationRun:
    scenarios: tuple[Scenario, ...] = ()
    cache: PrefixCacheRun | None = None
    canaries: Mapping[str, str] = field(default_factory=dict)  # tenant -> our synthetic canary
    binding: str = ""  # how the tenants were told apart (cache_salt, header, API keys)
    not_run: str | None = None
    not_run_status: str = "inconclusive"  # or "skip"
    healthy_after: Mapping[str, bool] = field(default_factory=dict)
    idle_after: Mapping[str, bool | None] = field(default_factory=dict)

    def scenario(self, name: str) -> Scenario | None:
        return next((s for s in self.scenarios if s.name == name), None)

    def requests(self) -> list[TenantRequest]:
        return [r for s in self.scenarios for r in s.requests]


@dataclass(frozen=True)
class Tenant:
    name: str  # "a" | "b"
    adapter: EngineAdapter  # the entry, with this tenant's credentials
    headers: Mapping[str, str]  # what this tenant's connection sends (for raw disconnect probes)
    salt: str | None  # cache_salt sent with every request, or None when the deployment binds tenants


@dataclass(frozen=True)
class IsolationSettings:
    timeout_s: float = 30.0
    accepted_tokens_per_second: float = 20000.0
    churn_allowed: bool = False
    churn_not_allowed_reason: str = ""
    binding: str = "cache_salt"
    known_markers: frozenset[str] = frozenset()  # other synthetic markers in play (capacity probes, demo)
    ca_bundle: str | None = None


class _Captured(Exception):
    def __init__(self, url: str, body: Any) -> None:
        super().__init__(url)
        self.url, self.body = url, body


class _CaptureClient:
    """Stands in for HttpClient so an adapter builds its request without sending it."""

    def post(self, url: str, body: Any, *, timeout_s: float | None = None):
        raise _Captured(url, body)

    post_stream = post


def request_shape(adapter: EngineAdapter, ids: list[int], *, max_tokens: int, stream: bool,
                  extra: Mapping[str, Any] | None) -> tuple[str, Any]:
    """(url, JSON body) that `adapter.complete` would send: the adapter stays the one place that
    knows an engine's request shape, and a raw connection can send it and walk away."""
    cls = type(adapter)
    shadow = cls.__new__(cls)
    shadow.__dict__.update(adapter.__dict__)
    shadow.client = _CaptureClient()  # type: ignore[assignment]
    try:
        shadow.complete(ids, max_tokens=max_tokens, stream=stream, timeout_s=1.0, extra=extra)
    except _Captured as captured:
        return captured.url, captured.body
    raise EngineError(f"{adapter.url}: the {adapter.kind} adapter built no request")


def contains_marker(text: str, marker: str) -> bool:
    """The marker, whole or as a fragment of its random tail."""
    if marker in text:
        return True
    tail = marker.rsplit("-", 1)[-1]
    return any(tail[i:i + FRAGMENT_MIN] in text for i in range(0, len(tail) - FRAGMENT_MIN + 1, 4))


class IsolationProber:
    def __init__(self, tenants: Sequence[Tenant], engines: Mapping[str, EngineAdapter],
                 snapshots: Sequence[EngineSnapshot], limits: Limits, settings: IsolationSettings,
                 progress: Callable[[str], None] = lambda _: None) -> None:
        self.tenants = {t.name: t for t in tenants}
        self.engines = engines
        self.snapshots = list(snapshots)
        self.limits = limits
        self.settings = settings
        self.progress = progress
        self.canaries = {name: new_marker(f"TENANT{name.upper()}") for name in TENANTS}
        self._ids: dict[str, list[int]] = {}
        self._stuck: dict[str, float] = {}  # url -> tokens an engine still held after a bounded wait
        ctx = limits.served_context
        self.gen = max(16, min(SCAN_MAX_TOKENS, ctx // 4))
        # The longest scanned prompt: within the stated limits, with room for the answer.
        self.longest = max(1, min(limits.max_accepted, ctx - self.gen - 1))
        pools = [p for s in self.snapshots if (p := s.pool_tokens()) is not None]
        self.min_pool = min(pools) if pools else None

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> IsolationRun:
        for name in TENANTS:
            canary = self.canaries[name]
            # The canary back to back: an echoing model repeats it from any offset.
            self._ids[name] = self._token_ids(self.tenants[name].adapter, self.longest + 2 * self.gen + self.limits.served_context,
                                              f"{canary} ")
        scenarios = [self._normal(), self._boundary(), self._over_capacity()]
        for name, fn in (("cancel-transfer", self._cancel_transfer), ("cancel-decode", self._cancel_decode),
                         ("load", self._load)):
            if self.settings.churn_allowed:
                scenarios.append(fn())
            else:
                scenarios.append(Scenario(name, _PURPOSES[name], skipped=self.settings.churn_not_allowed_reason, churn=True))
        cache = self._prefix_cache()
        healthy = {url: adapter.healthy() for url, adapter in self.engines.items()}
        idle = self._wait_idle()
        return IsolationRun(tuple(scenarios), cache, dict(self.canaries), self.settings.binding,
                            healthy_after=healthy, idle_after=idle)

    # -- scenarios -----------------------------------------------------------------------------
    def _normal(self) -> Scenario:
        n = max(1, self.longest // 2)
        return self._scenario("normal", lambda: [self._send(t, f"normal-{t}{i // 2 + 1}", n)
                                                 for i, t in enumerate("ababab")],
                              "both tenants ran and were scanned")

    def _boundary(self) -> Scenario:
        n = self.longest
        return self._scenario("boundary", lambda: [self._send(t, f"boundary-{t}{i + 1}", n)
                                                   for i, t in enumerate("abba")],
                              "both tenants ran at the longest accepted prompt")

    def _over_capacity(self) -> Scenario:
        lim = self.limits
        if lim.pool_bound and lim.pool_tokens is not None:
            over = lim.pool_tokens + max(1, (lim.served_context - lim.pool_tokens) // 2)
            over = max(lim.max_accepted + 1, min(over, lim.served_context - self.gen))
            where = f"over the {lim.pool_tokens:,}-token pool, within the served context"
        else:
            over = lim.served_context + 1
            where = "over the served context"

        def steps() -> list[TenantRequest]:
            out = []
            for first, second in (("a", "b"), ("b", "a")):
                out.append(self._send(first, f"over-capacity-{first}-long", self.longest))
                out.append(self._send(second, f"over-capacity-{second}-over", over, expect="reject"))
            return out

        return self._scenario("over-capacity", steps, f"refusal path exercised right after the other tenant's pages were freed ({where})")

    def _cancel_transfer(self) -> Scenario:
        size = self.longest
        if self.min_pool:
            size = max(1, min(size, self.min_pool // 2))
        victim = max(1, min(self.longest, int(size * 0.45)))
        deferred_before = self._metric_total(DEFERRED_RELEASE)
        pd = any(s.role is not Role.UNIFIED for s in self.snapshots)
        notes: list[str] = []

        def steps() -> list[TenantRequest]:
            out = []
            for leaver, other in (("a", "b"), ("b", "a")):
                out.append(self._abandon(leaver, f"cancel-transfer-{leaver}-left", size, after="transfer", notes=notes))
                time.sleep(CANCEL_PROPAGATION_S)
                with ThreadPoolExecutor(max_workers=2) as pool:
                    futures = [pool.submit(self._send, other, f"cancel-transfer-{other}{i + 1}", victim) for i in range(2)]
                    out.extend(f.result() for f in futures)
                self._wait_idle()
            return out

        scenario = self._scenario("cancel-transfer", steps, "", churn=True)
        deferred_after = self._metric_total(DEFERRED_RELEASE)
        if deferred_before is not None and deferred_after is not None and deferred_after > deferred_before:
            how = (f"confirmed: decode deferred {int(deferred_after - deferred_before)} release(s) until the "
                   "transfer drained (sglang:decode_deferred_kv_release_total), so the disconnect landed mid-transfer")
            occurred: bool | None = True
        elif any(r.crossings for r in scenario.requests):
            how, occurred = "confirmed by the canary crossing itself", True
        elif not pd:
            how, occurred = "unconfirmed: a unified engine shows no transfer, so a disconnect during prefill cannot be shown", None
        else:
            how, occurred = ("unconfirmed: no deferred-release counter moved and no page log is reachable over HTTP, so the "
                             "disconnect cannot be shown to have landed while KV was being written"), None
        if notes:
            how += "; " + "; ".join(notes)
        return _with(scenario, occurred=occurred, occurrence=how)

    def _cancel_decode(self) -> Scenario:
        n = max(1, min(self.longest, self.limits.served_context - CANCEL_DECODE_MAX_TOKENS - 1) // 2)
        max_tokens = max(self.gen, min(CANCEL_DECODE_MAX_TOKENS, self.limits.served_context - n - 1))
        notes: list[str] = []

        def steps() -> list[TenantRequest]:
            out = []
            for leaver, other in (("a", "b"), ("b", "a")):
                out.append(self._abandon(leaver, f"cancel-decode-{leaver}-left", n, after="token", notes=notes,
                                         max_tokens=max_tokens))
                out.append(self._send(other, f"cancel-decode-{other}", n))
            return out

        scenario = self._scenario("cancel-decode", steps, "", churn=True)
        left = [r for r in scenario.requests if r.abandoned]
        if left and all(r.abandoned == "after the first streamed token" for r in left):
            how, occurred = "confirmed: each disconnect came after a streamed token and before the answer ended", True
        else:
            how, occurred = "unconfirmed: " + ("; ".join(notes) or "no streamed token arrived before the disconnect"), None
        return _with(scenario, occurred=occurred, occurrence=how)

    def _load(self) -> Scenario:
        per = self.longest
        count = 4
        reach = ""
        if self.min_pool:
            target = int(self.min_pool * 0.9)
            count = max(4, -(-target // per))
            if count > MAX_LOAD_REQUESTS:
                count = MAX_LOAD_REQUESTS
            per = max(1, min(per, target // count))
            reach = f"{count} x {per:,} = {count * per:,} tokens against a {self.min_pool:,}-token pool"
        order = [TENANTS[i % 2] for i in range(count)]

        def steps() -> list[TenantRequest]:
            with ThreadPoolExecutor(max_workers=count) as pool:
                futures = [pool.submit(self._send, t, f"load-{t}{i // 2 + 1}", per) for i, t in enumerate(order)]
                return [f.result() for f in futures]

        scenario = self._scenario("load", steps, "", churn=True)
        near = self.min_pool is not None and count * per >= 0.8 * self.min_pool
        if near:
            how, occurred = f"requests at once: {reach}", True
        else:
            how = (f"unconfirmed: bounded to {count} requests of {per:,} tokens, "
                   + (f"{count * per:,} of a {self.min_pool:,}-token pool" if self.min_pool else "the pool size is unknown"))
            occurred = None
        return _with(scenario, occurred=occurred, occurrence=how)

    def _scenario(self, name: str, steps: Callable[[], list[TenantRequest]], shown: str, churn: bool = False) -> Scenario:
        self.progress(f"isolation: {name}")
        before = self._lifecycle()
        requests = steps()
        idle = self._wait_idle()
        after = self._lifecycle()
        deltas: dict[str, dict[str, float]] = {}
        for url in self.engines:
            b, a = before.get(url) or {}, after.get(url) or {}
            d = {k: round(a[k] - b[k], 3) for k in a if k in b}
            if d:
                deltas[url] = d
        ran = [r for r in requests if r.completion is not None]
        occurred = True if ran else None
        return Scenario(name, _PURPOSES[name], tuple(requests), occurred=occurred,
                        occurrence=shown if ran else "unconfirmed: no request was answered",
                        idle_after=idle, counter_deltas=deltas, churn=churn)

    # -- one request ---------------------------------------------------------------------------
    def _extra(self, tenant: str) -> dict[str, Any] | None:
        salt = self.tenants[tenant].salt
        return {"cache_salt": salt} if salt else None

    def _budget(self, tokens: int, expect: str) -> float:
        if expect == "reject":
            return self.settings.timeout_s
        return self.settings.timeout_s + tokens / self.settings.accepted_tokens_per_second

    def _send(self, tenant: str, name: str, tokens: int, *, expect: str = "accept", max_tokens: int | None = None) -> TenantRequest:
        ids = self._ids[tenant][:tokens]
        completion = self.tenants[tenant].adapter.complete(
            ids, max_tokens=max_tokens or self.gen, stream=False, timeout_s=self._budget(tokens, expect),
            extra=self._extra(tenant))
        return self._scan(tenant, name, completion, expect)

    def _scan(self, tenant: str, name: str, completion: Completion | None, expect: str = "accept",
              abandoned: str | None = None, text: str = "") -> TenantRequest:
        text = completion.text if completion is not None else text
        own = self.canaries[tenant]
        other = self.canaries["b" if tenant == "a" else "a"]
        known = {other, *self.settings.known_markers}
        crossings = []
        for found in foreign_markers(text, {own}, known):
            if found in known or found.endswith(" (fragment)"):
                crossings.append(found)
            else:  # marker-shaped but not one of ours in play (e.g. pieces of two): length and hash only
                digest = hashlib.sha256(found.encode()).hexdigest()
                crossings.append(f"unrecognised marker-shaped text ({len(found)} chars, sha256 {digest})")
        return TenantRequest(tenant, name, completion, expect, abandoned, contains_marker(text, own), tuple(crossings))

    def _abandon(self, tenant: str, name: str, tokens: int, *, after: str, notes: list[str],
                 max_tokens: int | None = None) -> TenantRequest:
        """Send through a raw connection and close it mid-flight, as a client that goes away.

        after="transfer": close once a decode engine's used-token gauge shows pages were
        reserved for the request (its KV is being written); "token": after the first streamed
        token. What arrived before the close is scanned too."""
        t = self.tenants[tenant]
        url, body = request_shape(t.adapter, self._ids[tenant][:tokens], max_tokens=max_tokens or self.gen,
                                  stream=True, extra=self._extra(tenant))
        decoders = [u for s in self.snapshots if s.role is Role.DECODE for u in [s.url] if u in self.engines]
        watch = decoders or list(self.engines)
        baseline = {u: self._used(u) for u in watch}
        parts = urlsplit(url)
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=self.settings.ca_bundle) if self.settings.ca_bundle else ssl.create_default_context()
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=self.settings.timeout_s, context=context)
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.settings.timeout_s)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        headers = {"Content-Type": "application/json", "User-Agent": "kvpreflight", **t.headers}
        received = b""
        how = None
        try:
            conn.request("POST", path, body=json.dumps(body), headers=headers)
            if after == "transfer" and not decoders:
                time.sleep(UNIFIED_CANCEL_AFTER_S)  # a unified engine shows no transfer: leave during prefill
                how = f"{UNIFIED_CANCEL_AFTER_S * 1000:.0f} ms after sending (during prefill)"
            elif after == "transfer":
                deadline = time.monotonic() + TRANSFER_START_WAIT_S
                while time.monotonic() < deadline:
                    moved = [u for u in watch if (v := self._used(u)) is not None and v > (baseline[u] or 0)]
                    if moved:
                        how = "after its pages were reserved (used-token gauge rose)"
                        break
                    if all(baseline[u] is None for u in watch):
                        time.sleep(0.01)
                        how = "10 ms after sending (no used-token gauge to watch)"
                        break
                    time.sleep(0.002)
                else:
                    notes.append(f"{name}: no used-token gauge rose within {TRANSFER_START_WAIT_S:g} s")
            else:
                resp = conn.getresponse()
                deadline = time.monotonic() + self._budget(tokens, "accept")
                while time.monotonic() < deadline:
                    line = resp.fp.readline()
                    if not line:
                        notes.append(f"{name}: the answer ended before a token was streamed")
                        break
                    received += line
                    text = line.decode("utf-8", errors="replace").strip()
                    if text.startswith("data:") and text[5:].strip() not in ("", "[DONE]"):
                        if '"error"' in text:
                            notes.append(f"{name}: the engine answered with an error frame")
                            break
                        how = "after the first streamed token"
                        break
        except (OSError, http.client.HTTPException) as exc:
            notes.append(f"{name}: {type(exc).__name__} before the disconnect")
        finally:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            conn.close()
        return self._scan(tenant, name, None, abandoned=how or "without the intended timing", text=received.decode("utf-8", errors="replace"))

    # -- prefix cache --------------------------------------------------------------------------
    def _prefix_cache(self) -> PrefixCacheRun:
        self.progress("isolation: prefix cache (cold, same-tenant warm, cross-tenant)")
        off = self._caching_off()
        tokens = max(1, min(self.longest, 1024))
        before = self._lifecycle()
        probes: list[CacheProbe] = []
        a, b = self.tenants["a"], self.tenants["b"]
        warmup = self._token_ids(a.adapter, tokens, f"{new_marker('WARMUP')} ")
        a.adapter.complete(warmup, max_tokens=1, stream=True, timeout_s=self._budget(tokens, "accept"), extra=self._extra("a"))
        for k in range(CACHE_PREFIXES):
            ids = self._token_ids(a.adapter, tokens, f"{new_marker('SHARED')} ")  # fresh: nobody has it cached
            for kind, tenant in (("cold", a), ("warm", a), ("warm", a), ("cross", b)):
                hits_before = self._metric_total(CACHE_HITS)
                c = tenant.adapter.complete(ids, max_tokens=1, stream=True, timeout_s=self._budget(tokens, "accept"),
                                            extra=self._extra(tenant.name))
                hits_after = self._metric_total(CACHE_HITS)
                delta = None if hits_before is None or hits_after is None else round(hits_after - hits_before, 3)
                probes.append(CacheProbe(kind, tenant.name, k, c, delta))
        self._wait_idle()
        del before
        return PrefixCacheRun(tuple(probes), self.settings.binding, off, prompt_tokens=tokens)

    def _caching_off(self) -> str | None:
        for s in self.snapshots:
            value = s.settings.get("enable_prefix_caching")
            if isinstance(value, str) and value.lower() == "false":
                return f"{s.url}: vllm:cache_config_info enable_prefix_caching=False"
            if value is False:
                return f"{s.url}: enable_prefix_caching is off"
            if s.settings.get("disable_radix_cache") is True:
                return f"{s.url}: disable_radix_cache is set"
        return None

    def _token_ids(self, adapter: EngineAdapter, count: int, seed: str) -> list[int]:
        return valid_token_ids(adapter, self.engines.values(), count, seed)

    # -- engine state --------------------------------------------------------------------------
    def _used(self, url: str) -> float | None:
        try:
            return self.engines[url].counters().used_tokens
        except EngineError:
            return None

    def _metric_total(self, names: Sequence[str]) -> float | None:
        total, seen = 0.0, False
        for adapter in self.engines.values():
            try:
                value = metric_sum(adapter.metrics(), *names)
            except EngineError:
                value = None
            if value is not None:
                total += value
                seen = True
        return total if seen else None

    def _lifecycle(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for url, adapter in self.engines.items():
            try:
                metrics = adapter.metrics()
            except EngineError:
                continue
            values = {}
            for key, names in (("transfer_failures", TRANSFER_FAILED), ("bootstrap_failures", BOOTSTRAP_FAILED),
                               ("deferred_releases", DEFERRED_RELEASE), ("prefix_cache_hits", CACHE_HITS)):
                v = metric_sum(metrics, *names)
                if v is not None:
                    values[key] = v
            out[url] = values
        return out

    def _wait_idle(self) -> dict[str, bool | None]:
        """Wait (bounded) until every engine's used-token gauge is back to 0. An engine already
        found stuck is not waited for again while it holds no more than it did then."""
        idle: dict[str, bool | None] = {}
        pending = set(self.engines)
        deadline = time.monotonic() + IDLE_WAIT_S
        while True:
            for url in list(pending):
                used = self._used(url)
                idle[url] = None if used is None else used == 0
                if idle[url] is not False or (used is not None and used <= self._stuck.get(url, -1)):
                    pending.discard(url)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for url in pending:
            used = self._used(url)
            if used:
                self._stuck[url] = used
        return idle


_PURPOSES = {
    "normal": "long prompts of both tenants, interleaved (A B A B A B): each reuses pages the other just freed",
    "boundary": "the longest accepted prompt, interleaved (A B B A)",
    "over-capacity": "a long request of one tenant, then an over-capacity request of the other (the incident path), and mirrored",
    "cancel-transfer": "one tenant disconnects while its KV is being written; the other tenant's requests take the freed pages",
    "cancel-decode": "one tenant disconnects after its first streamed token; the other tenant follows at once",
    "load": "both tenants at once, near the smallest KV pool",
}


def _with(s: Scenario, **changes: Any) -> Scenario:
    from dataclasses import replace

    return replace(s, **changes)


def run_isolation(entry: EngineAdapter, engines: Mapping[str, EngineAdapter], snapshots: Sequence[EngineSnapshot],
                  limits: Limits, settings: IsolationSettings, base_headers: Mapping[str, str],
                  tenant_headers: Sequence[Mapping[str, str]], *, salted: bool,
                  progress: Callable[[str], None] = lambda _: None) -> IsolationRun:
    """Build tenants A and B (each its own connection and credentials, the entry's request shape,
    a fresh cache_salt unless the deployment binds tenants itself) and run the probes."""
    from kvpreflight.engines.http import HttpClient

    clients: list[HttpClient] = []
    try:
        tenants = []
        for name, extra in zip(TENANTS, tenant_headers):
            headers = {**base_headers, **extra}
            client = HttpClient(headers=headers, ca_bundle=settings.ca_bundle, timeout_s=settings.timeout_s)
            clients.append(client)
            adapter = type(entry).__new__(type(entry))
            adapter.__dict__.update(entry.__dict__)
            adapter.client = client
            salt = f"kvpreflight-tenant-{name}-{secrets.token_hex(8)}" if salted else None
            tenants.append(Tenant(name, adapter, headers, salt))
        return IsolationProber(tenants, engines, snapshots, limits, settings, progress).run()
    except EngineError as exc:
        return IsolationRun(not_run=f"isolation probes could not run: {exc}")
    finally:
        for client in clients:
            client.close()


def ttft_summary(cache: PrefixCacheRun) -> dict[str, float] | None:
    """Median time-to-first-token of cold, same-tenant warm and cross-tenant requests."""
    out = {}
    for kind in ("cold", "warm", "cross"):
        values = [p.ttft_s for p in cache.of(kind) if p.completion.error_message is None and p.completion.status == 200]
        if not values:
            return None
        out[kind] = statistics.median(values)
    return out
