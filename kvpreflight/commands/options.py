"""Parsing of the option values `check`, `demo` and `fleet` share. Each bad value: one line, exit 2."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

from kvpreflight.errors import UsageError
from kvpreflight.model import Role, Waiver

ROLES = {r.value: r for r in Role}


def parse_url(text: str, what: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{what} {text!r} is not an http(s) URL; write it like http://host:30000")
    return text.rstrip("/")


def parse_endpoint(text: str) -> tuple[str, Role | None]:
    role_text, sep, rest = text.partition("=")
    if sep and role_text in ROLES:
        return parse_url(rest, "--endpoint"), ROLES[role_text]
    if sep and "://" not in role_text:
        raise UsageError(f"--endpoint {text!r}: unknown role {role_text!r}; use prefill=URL, decode=URL or unified=URL")
    return parse_url(text, "--endpoint"), None


def parse_logs(values: Sequence[str], endpoints: Sequence[str]) -> dict[str, Path]:
    logs: dict[str, Path] = {}
    for value in values:
        url, sep, path = value.rpartition("=")
        if not sep or not url or not path:
            raise UsageError(f"--log {value!r}: write it as URL=PATH, e.g. http://prefill-0:30000=/var/log/prefill.log")
        url = parse_url(url, "--log")
        if url not in endpoints:
            raise UsageError(f"--log {value!r}: {url} is not one of the --endpoint URLs")
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"--log {value!r}: {path} is not a readable file")
        logs[url] = p
    return logs


def parse_headers(values: Sequence[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise UsageError(f"--header {value.split(':')[0]!r}...: write it as 'Name: value'")
        headers[name.strip()] = content.strip()
    return headers


def api_key(env_name: str | None, file: Path | None) -> str | None:
    """The API key, from a file or an environment variable; never from argv."""
    if env_name and file:
        raise UsageError("--api-key-env and --api-key-file both given; pass one")
    if env_name:
        value = os.environ.get(env_name)
        if not value:
            raise UsageError(f"--api-key-env {env_name}: that environment variable is not set or empty")
        return value.strip()
    if file:
        try:
            value = file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"--api-key-file {file}: {exc.strerror}") from None
        if not value:
            raise UsageError(f"--api-key-file {file} is empty")
        return value
    return None


def tenant_headers(a_env: str | None, b_env: str | None, header_name: str | None
                   ) -> tuple[tuple[dict[str, str], dict[str, str]], str | None]:
    """Per-tenant request headers for the isolation probes, and how the deployment tells the
    tenants apart (None: it does not, kvpreflight sends a cache_salt per tenant). Keys come from
    environment variables only, never from argv."""
    if bool(a_env) != bool(b_env):
        raise UsageError("--tenant-a-key-env and --tenant-b-key-env go together: give both tenants their own key")
    a: dict[str, str] = {}
    b: dict[str, str] = {}
    binding = []
    if a_env and b_env:
        if a_env == b_env:
            raise UsageError("--tenant-a-key-env and --tenant-b-key-env name the same variable; the tenants need different keys")
        for env_name, headers, flag in ((a_env, a, "--tenant-a-key-env"), (b_env, b, "--tenant-b-key-env")):
            value = (os.environ.get(env_name) or "").strip()
            if not value:
                raise UsageError(f"{flag} {env_name}: that environment variable is not set or empty")
            headers["Authorization"] = f"Bearer {value}"
        if a["Authorization"] == b["Authorization"]:
            raise UsageError(f"{a_env} and {b_env} hold the same key; the tenants need different keys")
        binding.append(f"per-tenant API keys (${a_env}, ${b_env})")
    if header_name is not None:
        name = header_name.strip()
        if not name or any(c.isspace() or c == ":" for c in name):
            raise UsageError(f"--tenant-header {header_name!r}: give a header name, e.g. X-Tenant-Id")
        a[name], b[name] = "a", "b"
        binding.append(f"tenant header {name}: a|b")
    return (a, b), (" and ".join(binding) or None)


def parse_waivers(skips: Sequence[str], reasons: Sequence[str], known_ids: Sequence[str]) -> tuple[Waiver, ...]:
    if len(skips) != len(reasons):
        raise UsageError("every --skip CHECK_ID needs its own --reason TEXT (no reason, no skip)")
    waivers = []
    for check_id, why in zip(skips, reasons):
        if check_id not in known_ids:
            raise UsageError(f"--skip {check_id!r}: no such check; ids are {', '.join(known_ids)}")
        if not why.strip():
            raise UsageError(f"--skip {check_id}: the --reason is empty")
        waivers.append(Waiver(check_id, why.strip()))
    return tuple(waivers)


def positive(value: float | int | None, name: str) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{name} must be positive (got {value})")
