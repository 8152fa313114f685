"""The two calls a command that writes records makes (``check``, ``demo``).

1. Before anything runs: ``signer = prepare_signer(sign_key_option, unsigned=...)`` and
   ``subjects = parse_subjects(subject_options)``, so a missing key or a bad ``--subject`` is exit 2
   before minutes of probing.
2. After the report exists: ``emit_record(report, path=..., signer=signer, command_line=sys.argv,
   subjects=subjects, files_read=[...], secrets=..., test_result=..., configuration=...)``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kvpreflight.errors import naming
from kvpreflight.model import Report
from kvpreflight.record.attest import TestResultPredicate
from kvpreflight.record.errors import RecordError
from kvpreflight.record.keys import SIGN_KEY_ENV, SigningKey, load_signing_key, resolve_sign_key_path
from kvpreflight.record.sign import sign_statement, unsigned_envelope, write_record
from kvpreflight.record.statement import Subject, build_statement, parse_subject, subjects_of
from kvpreflight.record.statement import statement as build_statement_of


def parse_subjects(options: Iterable[str] | None) -> list[Subject]:
    """`NAME=sha256:HEX` strings; an error names the `--subject` it came from."""
    with naming("--subject"):
        return [parse_subject(text) for text in options or ()]


def prepare_signer(sign_key: str | os.PathLike[str] | None, *, unsigned: bool,
                   allow_insecure_key: bool = False) -> SigningKey | None:
    """The signing key (``--sign-key`` or ``$KVPREFLIGHT_SIGN_KEY``), or None with ``--unsigned``.

    Neither is an error: a record is signed unless the user asked, in so many words, for it not to be.
    """
    path = resolve_sign_key_path(sign_key)
    if unsigned:
        if sign_key:
            raise RecordError("--unsigned and --sign-key contradict each other; pass one")
        return None
    if path is None:
        raise RecordError(f"a record must be signed: pass --sign-key PATH or set {SIGN_KEY_ENV}=PATH "
                          "(make a key with `kvpreflight keygen --out DIR`), or pass --unsigned for a record verify will refuse")
    return load_signing_key(path, allow_insecure=allow_insecure_key)


def emit_record(
    report: Report,
    *,
    path: str | os.PathLike[str],
    signer: SigningKey | None,
    command_line: Sequence[str],
    subjects: Sequence[Subject],
    files_read: Iterable[str | os.PathLike[str]] = (),
    secrets: Iterable[str] = (),
    test_result: str | os.PathLike[str] | None = None,
    configuration: Sequence[tuple[str, Path]] = (),
) -> Path:
    """Build the statement (with `secrets` and every URL credential removed), sign it (or mark it
    unsigned when ``signer`` is None) and write it.

    With `test_result`, also write an in-toto Test Result there: the same subjects, the same key,
    `configuration` (name, file) listed by digest."""
    statement = build_statement(report, command_line=command_line, subjects=subjects,
                                files_read=[Path(p) for p in files_read], secrets=secrets)

    def sign(body: dict[str, Any]) -> dict[str, Any]:
        return sign_statement(body, signer) if signer is not None else unsigned_envelope(body)

    if test_result is not None:  # written first: the record on disk means both were made
        tested = build_statement_of(TestResultPredicate.of(report, configuration), subjects=subjects_of(statement),
                                    command_line=command_line, secrets=secrets)
        write_record(test_result, sign(tested))
    return write_record(path, sign(statement))
