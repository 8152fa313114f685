"""Sign a statement into a DSSE envelope, and write/read record files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvpreflight._internal.files import FileKind, write_atomic
from kvpreflight.record._io import read_input
from kvpreflight.record.dsse import IN_TOTO_PAYLOAD_TYPE, Envelope, Signature, envelope_from_bytes, pae
from kvpreflight.record.errors import RecordError
from kvpreflight.record.keys import SigningKey

UNSIGNED_MARK = "UNSIGNED: written with --unsigned; carries no signature and `kvpreflight verify` refuses it"


def statement_bytes(statement: dict[str, Any]) -> bytes:
    """The exact payload bytes: compact JSON with sorted keys."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sign_statement(statement: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    """A DSSE envelope dict: payloadType application/vnd.in-toto+json, one signature over the PAE."""
    body = statement_bytes(statement)
    sig = key.sign(pae(IN_TOTO_PAYLOAD_TYPE, body))
    return Envelope(body, IN_TOTO_PAYLOAD_TYPE, (Signature(keyid=key.keyid, sig=sig),)).to_dict()


def unsigned_envelope(statement: dict[str, Any]) -> dict[str, Any]:
    """The same envelope with no signature and a visible mark. Never passes ``verify``."""
    env = Envelope(statement_bytes(statement), IN_TOTO_PAYLOAD_TYPE, ()).to_dict()
    return {"unsigned": UNSIGNED_MARK, **env}


def write_record(path: str | os.PathLike[str], envelope: dict[str, Any]) -> Path:
    """Write the envelope as JSON, atomically (a reader never sees half a record), mode 0644."""
    try:
        return write_atomic(path, json.dumps(envelope, indent=2) + "\n")
    except OSError as exc:
        raise RecordError(f"cannot write record {path}: {exc.strerror}; choose a writable --record path") from None


def read_record(path: str | os.PathLike[str]) -> Envelope:
    """The DSSE envelope in `path`, read within the record size bound (its signature not yet checked)."""
    path = Path(path)
    raw = read_input(path, FileKind.RECORD, "pass the file that `kvpreflight check --record` wrote")
    return envelope_from_bytes(raw, str(path))
