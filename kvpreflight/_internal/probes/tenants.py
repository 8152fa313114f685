"""One synthetic tenant's connection to the entry: its adapter (its own credentials), the
headers a raw connection must repeat, and the cache_salt it sends (when kvpreflight binds tenants)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.probes.results import Tenant


@dataclass(frozen=True, kw_only=True)
class TenantClient:
    tenant: Tenant
    adapter: EngineAdapter  # the entry, with this tenant's credentials
    headers: Mapping[str, str]  # what this tenant's connection sends (for raw disconnect probes)
    salt: str | None  # cache_salt sent with every request, or None when the deployment binds tenants

    @property
    def extra(self) -> dict[str, Any] | None:
        """Request fields this tenant adds to every request."""
        return {"cache_salt": self.salt} if self.salt else None


@dataclass(frozen=True, kw_only=True)
class TenantPrompts:
    """Tenants A and B as every probe that carries a canary sends them: the capacity probes'
    near-limit requests and the isolation scenarios (probes/isolation.py opens them)."""

    clients: Mapping[Tenant, TenantClient]
    canaries: Mapping[Tenant, str]
    heads: Mapping[Tenant, str]  # each tenant's unique head: its prompt's first marker, never repeated
    ids: Mapping[Tenant, list[int]]  # the head, then the canary back to back, long enough for any probe
    answer_tokens: int  # a scanned answer: long enough to show another tenant's stale pages
