"""The in-toto Statement v1 that a release record carries, and its subjects.

The predicate says what was checked, where, with which result. It never holds response text, keys,
or secret values from the command line or the environment.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from kvpreflight.record.errors import RecordError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://kvpreflight.dev/release-record/v1"
RECORD_SCHEMA_VERSION = 1
NO_GPU_NOTE = "no NVIDIA GPU/driver visible"
REDACTED = "<redacted>"

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_SECRET_OPTION = re.compile(r"^--?(?:[\w-]*(?:api-?key|sign-key|token|secret|password|passwd|credential|auth)[\w-]*)$", re.I)
_HEADER_OPTION = re.compile(r"^(?:--header|-H)$")
_SECRET_HEADER = re.compile(r"(?:authorization|api-?key|token|secret|cookie|password|auth)", re.I)
_SECRET_ENV = re.compile(r"(?:API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)
# Evidence keys that would carry what an engine generated or was sent. Replaced by size + digest.
RESPONSE_KEYS = frozenset(
    {"text", "response_text", "response", "body", "content", "completion", "generated_text",
     "output", "prompt", "choices", "messages", "raw", "response_body"}
)


@dataclass(frozen=True)
class Subject:
    """One artifact the record is about: a name and its SHA-256 digest (lower-case hex)."""

    name: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "digest": {"sha256": self.sha256}}

    def __str__(self) -> str:
        return f"{self.name}=sha256:{self.sha256}"


SUBJECT_USAGE = "use --subject NAME=sha256:<64 hex digits>, e.g. --subject myapp=sha256:$(sha256sum app.tar | cut -d' ' -f1)"


def parse_subject(text: str) -> Subject:
    """Parse ``NAME=sha256:HEX`` strictly. Anything else is a usage error (exit 2)."""
    name, sep, digest = text.rpartition("=")
    if not sep or not name.strip():
        raise RecordError(f"{text!r} has no NAME=; {SUBJECT_USAGE}")
    if name != name.strip() or any(c.isspace() for c in name):
        raise RecordError(f"{text!r}: the name contains whitespace; {SUBJECT_USAGE}")
    algo, colon, hexdigest = digest.partition(":")
    if not colon or algo != "sha256":
        raise RecordError(f"{text!r}: digest must start with sha256:; {SUBJECT_USAGE}")
    if not _HEX64.fullmatch(hexdigest):
        raise RecordError(f"{text!r}: sha256 digest must be exactly 64 hex digits, got {len(hexdigest)} characters; {SUBJECT_USAGE}")
    return Subject(name=name, sha256=hexdigest.lower())


def file_subject(path: str | os.PathLike[str]) -> Subject:
    """The subject for a config or log file that was read: ``file:<path>`` and its digest."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise RecordError(f"cannot hash {path} for the record: {exc.strerror}; the file must stay readable until the record is written") from None
    return Subject(name=f"file:{path}", sha256=h.hexdigest())


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
    if _SECRET_HEADER.search(hname):
        dropped.append(hvalue)
        for part in hvalue.split():  # "Bearer sk-..." -> also the bare token
            dropped.append(part)
        return f"{hname}{sep}{' ' if sep == ':' else ''}{REDACTED}"
    return header


def _env_secrets() -> list[str]:
    return [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and v]


_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")
_URL_SECRET_PARAM = re.compile(r"(?i)([?&][\w-]*(?:key|token|secret|password|auth|sig)[\w-]*=)[^&#\s]+")


def _scrub(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        value = _URL_USERINFO.sub(rf"\1{REDACTED}@", value)
        value = _URL_SECRET_PARAM.sub(rf"\1{REDACTED}", value)
        for s in secrets:
            if s in value:
                value = value.replace(s, REDACTED)
        return value
    if isinstance(value, dict):
        return {str(_scrub(k, secrets)): _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v, secrets) for v in value]
    return value


def _omit_response_text(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if str(k).lower() in RESPONSE_KEYS and v is not None:
                if isinstance(v, (str, bytes)):
                    data = v.encode("utf-8") if isinstance(v, str) else v
                    out[k] = {"omitted": "response text is never recorded", "bytes": len(data),
                              "sha256": hashlib.sha256(data).hexdigest()}
                else:
                    out[k] = {"omitted": "response text is never recorded"}
            else:
                out[k] = _omit_response_text(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_omit_response_text(v) for v in value]
    return value


def _rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise RecordError("internal: record time must be timezone-aware")
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge_subjects(subjects: Iterable[Subject]) -> list[Subject]:
    seen: dict[str, Subject] = {}
    for s in subjects:
        old = seen.get(s.name)
        if old is not None and old.sha256 != s.sha256:
            raise RecordError(f"subject {s.name} given twice with different digests ({old.sha256[:12]}… and {s.sha256[:12]}…); give each name once")
        seen[s.name] = s
    return list(seen.values())


def build_statement(
    report: Any,
    *,
    command_line: list[str],
    subjects: list[Subject],
    files_read: list[Path] | tuple[Path, ...] = (),
    now: datetime | None = None,
    host: str | None = None,
) -> dict[str, Any]:
    """An in-toto Statement v1 about ``report``.

    Subjects: ``subjects`` (from ``--subject``) plus ``file:<path>`` with the digest of every file
    in ``files_read``. ``command_line`` is argv without the program name or with it; secret option
    values are dropped, and any secret value (from those options or from secret-named environment
    variables) found anywhere in the predicate is replaced by ``<redacted>``.
    """
    from kvpreflight.formats.json import report_to_dict

    all_subjects = _merge_subjects([*subjects, *(file_subject(p) for p in files_read)])
    if not all_subjects:
        raise RecordError("a record needs at least one subject; pass --subject NAME=sha256:HEX for the artifact being released")
    moment = now or datetime.now(timezone.utc)
    argv, dropped = redact_command_line(command_line)
    secrets = sorted({s for s in [*dropped, *_env_secrets()] if len(s) >= 8}, key=len, reverse=True)
    rd = report_to_dict(report)
    engines = []
    for e in rd["engines"]:
        engines.append({
            "url": e["url"], "engine": e["engine"], "version": e["version"], "role": e["role"],
            "model": e["model"],
            "context_served": e["context_length"],
            "context_checked": rd["context_length_promised"],
            "kv_pool_tokens": e["kv_pool_tokens"],
            "kv_pool_sources": e["kv_pool_sources"],
            "kv_pool_origins": e["kv_pool_origins"],
            "page_size": e["page_size"],
            "settings": e["settings"],
            "notes": e["notes"],
        })
    predicate: dict[str, Any] = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "report_schema_version": rd["schema_version"],
        "tool": rd["tool"],
        "time": _rfc3339(moment),
        "host": host if host is not None else socket.gethostname(),
        "command_line": argv,
        "started_at": rd["started_at"],
        "finished_at": rd["finished_at"],
        "entry": rd["entry"],
        "context_length_promised": rd["context_length_promised"],
        "engines": engines,
        "gpus": rd["gpus"],
        "gpu_summary": f"{len(rd['gpus'])} GPU(s)" if rd["gpus"] else NO_GPU_NOTE,
        "checks": _omit_response_text(rd["checks"]),
        "waivers": rd["waivers"],
        "verdict": rd["verdict"],
        "exit_code": rd["exit_code"],
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [s.to_dict() for s in all_subjects],
        "predicateType": PREDICATE_TYPE,
        "predicate": _scrub(predicate, secrets),
    }
