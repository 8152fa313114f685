"""The check ids: stable names the JSON report, waivers, records and `verify --require` use, in
report order (one module each under kvpreflight/_internal/checks/, which declares its Scope). Ground floor:
imports nothing of kvpreflight, so a parser of waivers needs no check's code."""

from __future__ import annotations

import enum


class CheckId(enum.StrEnum):
    KV_CAPACITY = "kv-capacity"
    KV_SOURCES_AGREE = "kv-sources-agree"
    OVERCAPACITY_REJECTED = "overcapacity-rejected"
    PROMPT_INTEGRITY = "prompt-integrity"
    MAX_TOKENS_CLAMP = "max-tokens-clamp"
    CONCURRENT_CAPACITY = "concurrent-capacity"
    ENGINE_HEALTHY_AFTER = "engine-healthy-after"
    TENANT_ISOLATION = "tenant-isolation"
    PREFIX_CACHE_ISOLATION = "prefix-cache-isolation"
    PD_TRANSFER = "pd-transfer"
    PD_CONSISTENCY = "pd-consistency"
    ENGINE_ADVISORIES = "engine-advisories"
    NETWORK_EXPOSURE = "network-exposure"


class Scope(enum.Enum):
    """What one evaluation of a check covers (each check module's SCOPE)."""

    GROUP = "one probe run: an entry and the engines behind it"
    DEPLOYMENT = "every engine read, at once"


CHECK_IDS: tuple[str, ...] = tuple(CheckId)
