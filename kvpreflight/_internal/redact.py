"""Redaction: secret values never reach a report, a record or a log.

One `Redactor` is built from the secret VALUES a run knows (API keys, tenant keys, the values of
secret-named headers, URL credentials: `secrets_of` collects them) and removes each one in every
form a report or a log could carry it: raw, JSON-escaped, URL-encoded, HTML-escaped and base64
(also inside a longer base64 text, e.g. `Authorization: Basic ...`). Credentials in URLs
(`user:pass@`, a `?api_key=` parameter) are removed whether or not their value is known.

Text is cut only through `cut`, which marks the cut with CUT_MARK; a Redactor also removes any
fragment of a secret (MIN_FRAGMENT_CHARS or more of its characters) that touches such a mark, since
a key cut before it was scrubbed is no longer the known value. Where the secrets are known at the
cut, scrub first (the boot launcher's quote of a dead engine's last lines).

`redact(text, secrets)` does one string, `redact_report(report, secrets)` a whole Report (every
string in it, keys of mappings included). The command line is redacted by option NAME
(`redact_command_line`), and environment variables whose NAME looks secret are secrets too
(`env_secrets`), as a record has always done.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import html
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

from kvpreflight.model import Report

REDACTED = "<redacted>"
# A header, variable or parameter with such a name carries a secret.
SECRET_NAME = re.compile(r"api[-_]?key|token|secret|passw(?:or)?d|credential|auth|cookie", re.I)
_SECRET_PARAM = re.compile(r"key|token|secret|password|auth|sig", re.I)
# An explicit secret shorter than this is not looked for (it would erase ordinary words); a value
# only GUESSED to be secret from its name (environment, command line) must be at least INFERRED.
MIN_SECRET_CHARS = 4
MIN_INFERRED_SECRET_CHARS = 8
# Where a text was cut; a secret's fragment this long touching the mark is removed too.
CUT_MARK = "\u2026"
MIN_FRAGMENT_CHARS = 8

_SECRET_OPTION = re.compile(r"^--?(?:[\w-]*(?:api-?key|sign-key|token|secret|password|passwd|credential|auth)[\w-]*)$", re.I)
_HEADER_OPTION = re.compile(r"^(?:--header|-H)$")
_SECRET_ENV = re.compile(r"API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")
_URL_SECRET_PARAM = re.compile(r"(?i)([?&][\w-]*(?:key|token|secret|password|auth|sig)[\w-]*=)[^&#\s]+")
_PERCENT = re.compile(r"%[0-9A-F]{2}")

T = TypeVar("T")


def _base64_forms(raw: bytes) -> set[str]:
    forms: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode("ascii")
        forms |= {whole, whole.rstrip("=")}
        if len(raw) < MIN_INFERRED_SECRET_CHARS:
            continue  # a short secret's partial encodings are too short to look for safely
        # Inside a longer text the secret starts at byte offset 0, 1 or 2 of a 3-byte group: the
        # characters that depend on its bytes alone are the same whatever surrounds it.
        for offset in range(3):
            text = encode(b"\0" * offset + raw).decode("ascii")
            forms.add(text[-(-8 * offset // 6):(8 * (offset + len(raw))) // 6])
    return forms


def secret_forms(secret: str) -> set[str]:
    """Every spelling of `secret` a report, record or log could hold."""
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], repr(secret)[1:-1]}
    # HTML-escaped: a gateway's HTML error page quoting the request ("Invalid token: sk-&quot;...")
    forms |= {html.escape(secret), html.escape(secret).replace("&#x27;", "&#39;"), html.escape(secret, quote=False)}
    for encoded in (quote(secret), quote(secret, safe=""), quote_plus(secret, safe="")):
        forms |= {encoded, _PERCENT.sub(lambda m: m.group().lower(), encoded)}
    return {f for f in forms | _base64_forms(secret.encode("utf-8")) if f}


class Redactor:
    """Removes a fixed set of secret values (and URL credentials) from text and from values."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms = {f for s in secrets if s and len(s) >= MIN_SECRET_CHARS for f in secret_forms(s)}
        # longest first, so a secret that contains another is removed whole
        alternatives = sorted(forms, key=lambda f: (-len(f), f))
        self._pattern = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        # what of a form a cut can leave: its first characters before a mark, its last after one
        self._heads = {f[:k] for f in forms for k in range(MIN_FRAGMENT_CHARS, len(f))}
        self._tails = {f[-k:] for f in forms for k in range(MIN_FRAGMENT_CHARS, len(f))}
        self._longest = max(map(len, forms), default=0)

    def text(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
            if CUT_MARK in text:
                text = self._cut_edges(text)
        text = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
        return _URL_SECRET_PARAM.sub(rf"\1{REDACTED}", text)

    def _cut_edges(self, text: str) -> str:
        """`text` without the fragments of a secret that touch a CUT_MARK (the longest of each)."""
        parts = text.split(CUT_MARK)
        for i in range(len(parts)):
            if i + 1 < len(parts):  # a mark follows: a form's head may end this part
                part = parts[i]
                size = next((k for k in range(min(self._longest, len(part)), MIN_FRAGMENT_CHARS - 1, -1)
                             if part[-k:] in self._heads), 0)
                if size:
                    parts[i] = part[:-size] + REDACTED
            if i > 0:  # a mark precedes: a form's tail may begin this part
                part = parts[i]
                size = next((k for k in range(min(self._longest, len(part)), MIN_FRAGMENT_CHARS - 1, -1)
                             if part[:k] in self._tails), 0)
                if size:
                    parts[i] = REDACTED + part[size:]
        return CUT_MARK.join(parts)

    def value(self, value: T) -> T:
        """`value` with every string in it redacted: str, mappings (keys too), lists, tuples, and
        dataclasses field by field (a frozen one is copied). Enums and other values are kept."""
        out: Any
        if isinstance(value, enum.Enum):  # Status and friends are str subclasses: never rewrite them
            return value
        if isinstance(value, str):
            out = self.text(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {f.name: self.value(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            out = dataclasses.replace(value, **changes)
        elif isinstance(value, Mapping):
            out = {self.value(k): self.value(v) for k, v in value.items()}
        elif isinstance(value, tuple):
            out = tuple(self.value(v) for v in value)
        elif isinstance(value, list):
            out = [self.value(v) for v in value]
        else:
            out = value
        return cast(T, out)  # the same kind of value, with its strings replaced


def cut(text: str, limit: int, *, keep_end: bool = False) -> str:
    """`text` in at most `limit` characters and CUT_MARK where it was cut (its start, or with
    `keep_end` its end); the one way kvpreflight shortens a text it quotes, so that a Redactor can
    find the cut edge and remove a secret's fragment left at it."""
    if len(text) <= limit:
        return text
    return CUT_MARK + text[len(text) - limit:] if keep_end else text[:limit] + CUT_MARK


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without any form of any of `secrets`, and without URL credentials."""
    return Redactor(secrets).text(text)


def redact_report(report: Report, secrets: Iterable[str] = ()) -> Report:
    """The same Report with every string in it (URLs, messages, evidence, notes, settings) redacted."""
    return Redactor(secrets).value(report)


def secrets_of(*, values: Iterable[str | None] = (), headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
               urls: Iterable[str | None] = ()) -> frozenset[str]:
    """The secret values a run knows: explicit `values` (API keys, tenant keys), the value of every
    header whose name looks secret (and each word of it: `Bearer sk-...` -> `sk-...`), and the
    credentials in `urls` (the userinfo, its password, and secret-named query parameters)."""
    found = {v for v in values if v}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in pairs:
        if value and SECRET_NAME.search(name):
            found |= {value, *(w for w in value.split() if len(w) >= MIN_INFERRED_SECRET_CHARS)}
    for url in urls:
        if not url:
            continue
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        if userinfo:
            user, _, password = userinfo.partition(":")
            found |= {userinfo, password} if password else {user}
        found |= {v for k, v in parse_qsl(parts.query) if v and _SECRET_PARAM.search(k)}
    return frozenset(s for s in found if s)


def env_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose NAME looks secret (`*_API_KEY`, `*TOKEN*`, ...)."""
    env = os.environ if environ is None else environ
    return [v for k, v in env.items() if _SECRET_ENV.search(k) and len(v) >= MIN_INFERRED_SECRET_CHARS]


def redact_command_line(argv: Iterable[str]) -> tuple[list[str], list[str]]:
    """Drop the values of secret-bearing options. Returns (redacted argv, the values dropped).

    Secret options: anything named like --api-key*, --sign-key*, --*token*, --*secret*,
    --*password*, --*auth*; and the value of --header/-H when the header is Authorization,
    X-Api-Key, a cookie or a token. ``--opt=value`` and ``--opt value`` are both handled.
    """
    out: list[str] = []
    dropped: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name.startswith("-") and _SECRET_OPTION.match(name):
            if eq:
                out.append(f"{name}={REDACTED}")
                dropped.append(value)
            else:
                out.append(arg)
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    out.append(REDACTED)
                    dropped.append(args[i + 1])
                    i += 1
        elif _HEADER_OPTION.match(name):
            if eq:
                out.append(f"{name}={_redact_header(value, dropped)}")
            else:
                out.append(arg)
                if i + 1 < len(args):
                    out.append(_redact_header(args[i + 1], dropped))
                    i += 1
        else:
            out.append(arg)
        i += 1
    return out, dropped


def _redact_header(header: str, dropped: list[str]) -> str:
    match = re.match(r"^\s*([^:=]+?)\s*([:=])\s*(.*)$", header, re.S)
    if match is None:
        dropped.append(header)
        return REDACTED  # cannot tell which header: fail closed
    hname, sep, hvalue = match.groups()
    if SECRET_NAME.search(hname):
        dropped.append(hvalue)
        dropped.extend(hvalue.split())  # "Bearer sk-..." -> also the bare token
        return f"{hname}{sep}{' ' if sep == ':' else ''}{REDACTED}"
    return header
