"""DSSE envelope: the PAE bytes, and strict parsing of what a user hands to verify."""

from __future__ import annotations

import base64

import pytest

from kvpreflight.record import RecordError, pae
from kvpreflight.record.dsse import envelope_from_bytes, envelope_from_dict


def test_pae_matches_the_dsse_spec_test_vector():
    assert pae("http://example.com/HelloWorld", b"hello world") == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_pae_counts_bytes_not_characters():
    assert pae("t", "é".encode()) == b"DSSEv1 1 t 2 \xc3\xa9"


def test_envelope_round_trips_and_accepts_urlsafe_unpadded_base64():
    env = envelope_from_dict({"payload": base64.urlsafe_b64encode(b"\xfb\xff?").decode().rstrip("="),
                              "payloadType": "x", "signatures": [{"keyid": "k", "sig": "AAEC"}]})
    assert env.payload == b"\xfb\xff?"
    assert env.signatures[0].sig == b"\x00\x01\x02"
    assert envelope_from_dict(env.to_dict()) == env


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"{", "is not JSON"),
        (b"[]", "top level is not a JSON object"),
        (b'{"payloadType": "x", "signatures": []}', "payload is missing"),
        (b'{"payload": "!!!", "payloadType": "x", "signatures": []}', "payload is not valid base64"),
        (b'{"payload": "aGk=", "signatures": []}', "payloadType is missing"),
        (b'{"payload": "aGk=", "payloadType": "x"}', "signatures is missing"),
        (b'{"payload": "aGk=", "payloadType": "x", "signatures": [{"keyid": "k", "sig": "%%"}]}', "signatures[0].sig is not valid base64"),
    ],
)
def test_malformed_envelopes_are_bad_input_with_a_named_field(raw, fragment):
    with pytest.raises(RecordError) as info:
        envelope_from_bytes(raw, "rec.json")
    assert fragment in str(info.value)
    assert info.value.exit_code == 2
