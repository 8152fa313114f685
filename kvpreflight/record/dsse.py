"""DSSE envelopes (https://github.com/secure-systems-lab/dsse, protocol v1): PAE, build, parse.

Only the envelope shape and the bytes that get signed live here; keys live in ``keys.py``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.redact import cut
from kvpreflight.record.errors import RecordError

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


def pae(payload_type: str, body: bytes) -> bytes:
    """Pre-Authentication Encoding: ``DSSEv1 SP LEN(type) SP type SP LEN(body) SP body``."""
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(type_bytes), type_bytes, len(body), body)


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    payload: bytes
    payload_type: str
    signatures: tuple[Signature, ...]

    def pae(self) -> bytes:
        return pae(self.payload_type, self.payload)

    def to_dict(self) -> dict[str, Any]:
        return {
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "payloadType": self.payload_type,
            "signatures": [
                {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")} for s in self.signatures
            ],
        }


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or not value:
        raise RecordError(f"malformed record: {what} is missing or not a string; the file is not a kvpreflight DSSE envelope")
    try:
        # DSSE allows standard or URL-safe base64; accept both, padded or not, but nothing else.
        text = value.strip().replace("-", "+").replace("_", "/")
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise RecordError(f"malformed record: {what} is not valid base64; the file was damaged or is not a DSSE envelope") from None


def envelope_from_dict(data: Any) -> Envelope:
    """Strictly parse a DSSE envelope dict. Any structural problem is bad input (exit 2)."""
    if not isinstance(data, dict):
        raise RecordError("malformed record: top level is not a JSON object; "
                          "expected a DSSE envelope with payload, payloadType, signatures")
    payload = _b64(data.get("payload"), "payload")
    payload_type = data.get("payloadType")
    if not isinstance(payload_type, str) or not payload_type:
        raise RecordError("malformed record: payloadType is missing; expected a DSSE envelope with payload, payloadType, signatures")
    raw_sigs = data.get("signatures")
    if not isinstance(raw_sigs, list):
        raise RecordError("malformed record: signatures is missing or not a list; expected a DSSE envelope")
    sigs = []
    for i, item in enumerate(raw_sigs):
        if not isinstance(item, dict):
            raise RecordError(f"malformed record: signatures[{i}] is not an object")
        keyid = item.get("keyid", "")
        if not isinstance(keyid, str):
            raise RecordError(f"malformed record: signatures[{i}].keyid is not a string")
        sigs.append(Signature(keyid=keyid, sig=_b64(item.get("sig"), f"signatures[{i}].sig")))
    return Envelope(payload=payload, payload_type=payload_type, signatures=tuple(sigs))


class DuplicateKey(ValueError):
    """A JSON object names one key twice."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def loads_unique(raw: bytes | str) -> Any:
    """JSON whose every object names each key once (else DuplicateKey): Python keeps the last of
    two equal keys, a verifier that keeps the first would read another document."""
    return json.loads(raw, object_pairs_hook=_unique)


def envelope_from_bytes(raw: bytes, source: str) -> Envelope:
    try:
        data = loads_unique(raw)
    except DuplicateKey as exc:
        raise RecordError(f"malformed record: {source} names the key {cut(str(exc), 60)!r} twice in one object; "
                          "a record is read one way by every verifier or not at all") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"malformed record: {source} is not JSON ({exc.msg if hasattr(exc, 'msg') else exc}); "
                          "pass the .dsse.json file that `kvpreflight check --record` wrote") from None
    except RecursionError:
        raise RecordError(f"malformed record: {source} is JSON nested too deeply to read; not a kvpreflight DSSE envelope") from None
    return envelope_from_dict(data)
