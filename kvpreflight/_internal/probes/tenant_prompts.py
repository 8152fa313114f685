"""Tenants A and B opened for the probes that carry canaries: each its own connection and
credentials, a cache_salt unless the deployment binds tenants, a canary, and its prompt."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.probes.isolation_sizes import IsolationSizes
from kvpreflight._internal.probes.markers import new_marker
from kvpreflight._internal.probes.results import Tenant
from kvpreflight._internal.probes.session import ProbeSession
from kvpreflight._internal.probes.tenants import TenantClient, TenantPrompts
from kvpreflight._internal.probes.tokens import valid_token_ids


def tenant_prompt(adapter: EngineAdapter, engines: Iterable[EngineAdapter], head: str, canary: str, length: int) -> list[int]:
    """`length` tokens: the unique head once, then the canary back to back. An echoing model
    repeats the canary from any offset; a long-range one (the builtin engine's copy head) also
    the head, which no window near a long prompt's tail holds (an attention window shows)."""
    head_ids = valid_token_ids(adapter, engines, len(head) + 1, f"{head} ")  # at most a token a character
    return head_ids + valid_token_ids(adapter, engines, max(1, length - len(head_ids)), f"{canary} ")


@contextmanager
def open_tenants(session: ProbeSession, tenant_headers: Sequence[Mapping[str, str]], *, salted: bool) -> Iterator[TenantPrompts]:
    """Tenants A and B: each its own connection and credentials, the entry's request shape, a
    fresh cache_salt unless the deployment binds tenants itself, a fresh canary, and its prompt.
    Raises EngineError when a prompt cannot be tokenized."""
    if salted and not session.entry.takes_cache_salt:
        raise EngineError(f"{session.entry.url}: {session.entry.kind}'s requests take no cache_salt, so kvpreflight "
                          "cannot tell its tenants apart; give each tenant its own key (--tenant-a-key-env, "
                          "--tenant-b-key-env) or --tenant-header where the deployment binds tenants")
    clients: list[HttpClient] = []
    limits = session.limits
    try:
        tenants: dict[Tenant, TenantClient] = {}
        for tenant, extra in zip(Tenant, tenant_headers, strict=True):
            http = session.connection.client(extra)
            clients.append(http)
            salt = f"kvpreflight-tenant-{tenant.value}-{secrets.token_hex(8)}" if salted else None
            tenants[tenant] = TenantClient(tenant=tenant, adapter=session.entry.with_client(http),
                                           headers={**session.connection.headers, **extra}, salt=salt)
        canaries = {tenant: new_marker(f"TENANT{tenant.label}") for tenant in Tenant}
        heads = {tenant: new_marker(f"HEAD{tenant.label}") for tenant in Tenant}
        sizes = IsolationSizes.of(limits, [])
        length = max(limits.max_accepted, sizes.longest + 2 * sizes.gen + limits.served_context)
        ids = {tenant: tenant_prompt(tenants[tenant].adapter, session.engines.values(), heads[tenant], canaries[tenant], length)
               for tenant in Tenant}
        yield TenantPrompts(clients=tenants, canaries=canaries, heads=heads, ids=ids, answer_tokens=sizes.gen)
    finally:
        for http in clients:
            http.close()
