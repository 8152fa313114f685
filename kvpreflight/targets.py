"""What a check looks at and how it authenticates, parsed from text into typed values.

Shared by the CLI (`--endpoint`, `--log`, `--header`, `--skip`), the fleet inventory and boot
specs. Messages say what is wrong with the value and name no flag or field: the caller adds that
with `kvpreflight.errors.naming` ("--endpoint: 'ftp://x' is not an http(s) URL ...").
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from kvpreflight._internal.files import FileKind, read_text
from kvpreflight._internal.redact import cut
from kvpreflight.errors import ConfigError
from kvpreflight.model import Role, Waiver

__all__ = [
    "Auth", "Target", "parse_endpoint", "parse_endpoints", "parse_header", "parse_log", "parse_url", "parse_waiver", "secret_from_env",
    "secret_from_file", "tenant_auth",
]


@dataclass(frozen=True)
class Target:
    """One engine that holds a KV pool."""

    url: str
    role: Role | None = None  # stated by the user (ROLE=URL) or the boot spec; overrides the reported role


@dataclass(frozen=True, kw_only=True)
class Auth:
    """How kvpreflight's requests authenticate, and the secret values no output may show."""

    headers: Mapping[str, str]  # sent with every request (API key as Authorization, --header)
    ca_bundle: str | None = None
    client_cert: str | None = None  # PEM for gateways that require mutual TLS (the key may be inside)
    client_key: str | None = None
    # Two-tenant probes: headers for synthetic tenants a and b; when either is set the deployment
    # binds tenants itself and no cache_salt is added.
    tenant_headers: tuple[Mapping[str, str], Mapping[str, str]] = field(default_factory=lambda: ({}, {}))  # each Auth its own
    tenant_binding: str | None = None  # how the deployment tells tenants apart (None: a cache_salt per tenant)
    secrets: frozenset[str] = frozenset()  # every secret value above, for redaction


def parse_url(text: str) -> str:
    """An http(s) URL with a host, without its trailing slash (ConfigError showing how to write one)."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{text!r} is not an http(s) URL; write it like http://host:30000")
    return text.rstrip("/")


def parse_endpoint(text: str) -> Target:
    """`URL` or `ROLE=URL` (prefill, decode, unified)."""
    role_text, sep, rest = text.partition("=")
    roles = {r.value: r for r in Role}
    if sep and role_text in roles:
        return Target(parse_url(rest), roles[role_text])
    if sep and "://" not in role_text:
        raise ConfigError(f"{text!r}: unknown role {role_text!r}; use prefill=URL, decode=URL or unified=URL")
    return Target(parse_url(text))


def parse_endpoints(texts: Iterable[str]) -> tuple[Target, ...]:
    """Each `URL` or `ROLE=URL`, parsed; a URL given twice is refused."""
    targets: list[Target] = []
    for text in texts:
        target = parse_endpoint(text)
        if any(t.url == target.url for t in targets):
            raise ConfigError(f"{target.url} given twice")
        targets.append(target)
    return tuple(targets)


def parse_log(text: str, endpoints: Sequence[str] | None) -> tuple[str, Path]:
    """`URL=PATH`: the log of one of `endpoints` (an engine's is an independent capacity source;
    a router's is read for danger lines). None: any URL (the router at the entry names the engines)."""
    url, sep, path = text.rpartition("=")
    if not sep or not url or not path:
        raise ConfigError(f"{text!r}: write it as URL=PATH, e.g. http://prefill-0:30000=/var/log/prefill.log")
    url = parse_url(url)
    if endpoints is not None and url not in endpoints:
        raise ConfigError(f"{text!r}: {url} is not one of the engines' or the entry's URLs")
    if not Path(path).is_file():
        raise ConfigError(f"{text!r}: {path} is not a readable file")
    return url, Path(path)


def parse_header(text: str) -> tuple[str, str]:
    """`Name: value` as (name, value), both stripped; a missing colon or a name with spaces is refused."""
    name, sep, content = text.partition(":")
    if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
        raise ConfigError(f"{text.split(':')[0]!r}...: write a header as 'Name: value'")
    return name.strip(), content.strip()


# Secrets are scrubbed from every output by value; a shorter one would scrub ordinary words.
# Seconds a refusal or a short request may take (`--timeout`, an inventory's `timeout`); accepted
# long prompts get more, from the engine's measured speed (probes/budget.py).
REQUEST_TIMEOUT_S = 30.0
MIN_SECRET_LENGTH = 8
# Header names whose values are secrets (besides those named with --secret-header).
SECRET_HEADER = re.compile(r"(?:authorization|api-?key|token|secret|cookie|password|auth)", re.I)


def checked_secret(value: str, where: str) -> str:
    if len(value) < MIN_SECRET_LENGTH:
        raise ConfigError(f"{where} is shorter than {MIN_SECRET_LENGTH} characters; kvpreflight removes secrets "
                          "from every output by value, and so refuses one that short (use a real key)")
    return value


def secret_from_env(name: str) -> str:
    """A secret's value from the environment variable `name` (never from argv)."""
    value = (os.environ.get(name) or "").strip()
    if not value:
        raise ConfigError(f"the environment variable {name} is not set or empty")
    return checked_secret(value, f"the value of {name}")


def secret_from_file(path: Path) -> str:
    """A secret's value from a file (bounded, a regular file), stripped; never from argv."""
    value = read_text(path, FileKind.SECRET).strip()
    if not value:
        raise ConfigError(f"{path} is empty")
    return checked_secret(value, f"the key in {path}")


def tenant_auth(a_key: str | None, b_key: str | None, header_name: str | None,
                key_names: tuple[str, str] = ("tenant A's key", "tenant B's key")
                ) -> tuple[tuple[dict[str, str], dict[str, str]], str | None]:
    """Per-tenant request headers for the isolation probes, and how the deployment tells tenants
    apart (None: it does not, and kvpreflight sends a cache_salt per tenant)."""
    if bool(a_key) != bool(b_key):
        raise ConfigError("tenant A's and tenant B's keys go together: give both tenants their own key")
    a: dict[str, str] = {}
    b: dict[str, str] = {}
    binding = []
    if a_key and b_key:
        if a_key == b_key:
            raise ConfigError(f"{key_names[0]} and {key_names[1]} are the same key; the tenants need different keys")
        a["Authorization"], b["Authorization"] = f"Bearer {a_key}", f"Bearer {b_key}"
        binding.append(f"per-tenant API keys ({key_names[0]}, {key_names[1]})")
    if header_name is not None:
        name = header_name.strip()
        if not name or any(c.isspace() or c == ":" for c in name):
            raise ConfigError(f"{header_name!r}: give a header name, e.g. X-Tenant-Id")
        a[name], b[name] = "a", "b"
        binding.append(f"tenant header {name}: a|b")
    return (a, b), (" and ".join(binding) or None)


def parse_waiver(check_id: str, reason: str, known_ids: Sequence[str], until: str | None = None) -> Waiver:
    """A waiver of a known check id, with its reason and optional last day (YYYY-MM-DD)."""
    if check_id not in known_ids:
        raise ConfigError(f"{check_id!r}: no such check; ids are {', '.join(known_ids)}")
    if not reason.strip():
        raise ConfigError(f"{check_id}: a waived check needs a reason (it goes into the report and record)")
    return Waiver(check_id, reason.strip(), waiver_expiry(until) if until is not None else None)


def waiver_expiry(text: str) -> str:
    """YYYY-MM-DD, a real day (the waiver holds through it)."""
    import datetime

    try:
        return datetime.date.fromisoformat(text.strip()).isoformat() if len(text.strip()) == 10 else _bad_day(text)
    except ValueError:
        return _bad_day(text)


def refuse_expired_waivers(waivers: Sequence[Waiver], today: str | None = None) -> None:
    """A waiver past its last day would make a record `verify` refuses: refuse the run now instead."""
    import datetime

    today = today or datetime.datetime.now(datetime.UTC).date().isoformat()
    for w in waivers:
        if w.until is not None and w.until < today:
            raise ConfigError(f"the waiver of {w.check_id} expired on {w.until} ({w.reason}); "
                              "fix the check or renew the waiver with a later --until (or until: in the spec)")


def _bad_day(text: str) -> str:
    raise ConfigError(f"{cut(text, 40)!r} is not a day; give the waiver's last day as YYYY-MM-DD")


def positive(value: float | int | None) -> None:
    """A count, a size or a number of seconds: finite and above zero."""
    if value is not None and (isinstance(value, float) and not math.isfinite(value) or value <= 0):
        raise ConfigError(f"must be a positive number (got {value})")
