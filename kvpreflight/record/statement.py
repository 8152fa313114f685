"""The in-toto Statement v1 a record carries, its subjects, and the one builder of both kinds.

`statement(predicate, subjects=, command_line=)` is the only place a statement is put together: it
redacts the command line by option name and then removes every secret (the values the caller
passes, the dropped option values, secret-named environment variables, URL credentials) from the
whole predicate. The predicate never holds response text (see `ReleasePredicate.of`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.clock import rfc3339
from kvpreflight._internal.files import FileKind, sha256_of
from kvpreflight._internal.redact import MIN_INFERRED_SECRET_CHARS, Redactor, env_secrets, redact_command_line
from kvpreflight.model import Report
from kvpreflight.record.errors import RecordError
from kvpreflight.record.predicate import FleetPredicate, Predicate, ReleasePredicate

if TYPE_CHECKING:
    from kvpreflight.record.attest import StandardPredicate

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


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
    digest = sha256_of(path, FileKind.SUBJECT, RecordError, missing=f"cannot hash {path} for the record: it no longer "
                       "exists; the file must stay readable until the record is written")
    return Subject(name=f"file:{path}", sha256=digest)


def _merge_subjects(subjects: Iterable[Subject]) -> list[Subject]:
    seen: dict[str, Subject] = {}
    for s in subjects:
        old = seen.get(s.name)
        if old is not None and old.sha256 != s.sha256:
            raise RecordError(f"subject {s.name} given twice with different digests ({old.sha256[:12]}… and {s.sha256[:12]}…); "
                              "give each name once")
        seen[s.name] = s
    return list(seen.values())


def statement(predicate: Predicate | StandardPredicate, *, subjects: Sequence[Subject], command_line: Sequence[str],
              secrets: Iterable[str] = ()) -> dict[str, Any]:
    """An in-toto Statement v1 carrying `predicate` (its type says which), about `subjects`.

    `command_line` is argv, with or without the program name; the values of secret options are
    dropped (kvpreflight's own predicates keep the rest; the standard ones have no field for it).
    Then every secret (`secrets`, the dropped values, the values of secret-named environment
    variables) and every URL credential is removed from the whole predicate.
    """
    if not subjects:
        raise RecordError("a record needs at least one subject; pass --subject NAME=sha256:HEX for the artifact being released")
    argv, dropped = redact_command_line(command_line)
    guessed = [s for s in [*dropped, *env_secrets()] if len(s) >= MIN_INFERRED_SECRET_CHARS]
    if isinstance(predicate, (ReleasePredicate, FleetPredicate)):
        predicate = replace(predicate, command_line=tuple(argv))
    body = Redactor([*secrets, *guessed]).value(predicate.to_dict())
    engines = [e for e in body.get("engines") or [] if isinstance(e, dict) and isinstance(e.get("url"), str)]
    all_subjects = _merge_subjects([*subjects, *(engine_subject(e) for e in engines)])
    return {
        "_type": STATEMENT_TYPE,
        "subject": [s.to_dict() for s in all_subjects],
        "predicateType": predicate.predicate_type,
        "predicate": body,
    }


def subjects_of(statement: Mapping[str, Any]) -> tuple[Subject, ...]:
    """The sha256 subjects of a statement dict (others are skipped: kvpreflight writes none)."""
    out = []
    for item in statement.get("subject") or []:
        if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("digest"), dict):
            digest = item["digest"].get("sha256")
            if isinstance(digest, str):
                out.append(Subject(item["name"], digest.lower()))
    return tuple(out)


ENGINE_IDENTITY = ("engine", "version", "model", "settings")


def engine_subject(engine: dict[str, Any]) -> Subject:
    """``engine:<url>``: the digest of what the engine said it is (kind, version, model and its
    launch settings, secrets already removed), so a record binds to what really ran."""
    identity = {key: engine.get(key) for key in ENGINE_IDENTITY}
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return Subject(name=f"engine:{engine['url']}", sha256=hashlib.sha256(canonical.encode()).hexdigest())


def build_statement(
    report: Report,
    *,
    command_line: Sequence[str],
    subjects: Sequence[Subject],
    files_read: Iterable[Path] = (),
    now: datetime | None = None,
    host: str | None = None,
    secrets: Iterable[str] = (),
) -> dict[str, Any]:
    """The release record's statement about `report`.

    Subjects: `subjects` (from ``--subject``) plus ``file:<path>`` with the digest of every file in
    `files_read`. Redaction as in :func:`statement`.
    """
    predicate = ReleasePredicate.of(report, time=rfc3339(now) if now is not None else None, host=host)
    return statement(predicate, subjects=[*subjects, *(file_subject(p) for p in files_read)],
                     command_line=command_line, secrets=secrets)
