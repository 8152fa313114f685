"""Signed release records: an in-toto Statement v1 in a DSSE envelope, and its verification.

Public interface (what ``check`` and ``verify`` call). Most commands need only ``release.py``:
``prepare_signer`` + ``parse_subjects`` before running, ``emit_record`` after. The parts:

- :func:`parse_subject` ``"NAME=sha256:HEX"`` -> :class:`Subject`
- :class:`ReleasePredicate`, :class:`FleetPredicate`: the two predicates, typed (``to_dict``/``from_dict``)
- :func:`statement` (predicate, subjects=, command_line=, secrets=) -> statement dict: the one builder;
  :func:`build_statement` (report, command_line=, subjects=, files_read=, secrets=) for a release
- :func:`resolve_sign_key_path` (``--sign-key`` value or ``$KVPREFLIGHT_SIGN_KEY``) -> path or None
- :func:`load_signing_key` (path) -> :class:`SigningKey`
- :func:`sign_statement` (statement, key) -> DSSE envelope dict; :func:`unsigned_envelope` (statement)
- :func:`write_record` (path, envelope)
- :func:`read_record`, :func:`load_public_key`, :class:`Policy`, :func:`verify_envelope` (our records);
  :func:`verify_attestation` (ours, an in-toto Test Result or a SLSA Verification Summary)
- :class:`VerifyOptions` (``verify``'s options, unparsed) -> :func:`build_verify_plan` (every rule between
  them, keys loaded) -> :func:`verify_files` (the gate ``verify`` runs: OK/FAIL per file, exit code)
- ``attest.py``: the Test Result ``emit_record(..., test_result=)`` writes and the VSA ``verify --vsa`` writes

Every failure is a :class:`RecordError` (exit 2 bad input, exit 1 refusal).
"""

from kvpreflight._internal.redact import redact_command_line
from kvpreflight.record.dsse import IN_TOTO_PAYLOAD_TYPE, Envelope, pae
from kvpreflight.record.errors import RecordError
from kvpreflight.record.gate import verify_files
from kvpreflight.record.keys import (
    PASSWORD_ENV,
    SIGN_KEY_ENV,
    PublicKey,
    SigningKey,
    generate,
    load_public_key,
    load_signing_key,
    resolve_sign_key_path,
    write_keypair,
)
from kvpreflight.record.predicate import FLEET_PREDICATE_TYPE, PREDICATE_TYPE, FleetDeployment, FleetPredicate, ReleasePredicate
from kvpreflight.record.release import emit_record, parse_subjects, prepare_signer
from kvpreflight.record.sign import read_record, sign_statement, unsigned_envelope, write_record
from kvpreflight.record.statement import STATEMENT_TYPE, Subject, build_statement, file_subject, parse_subject, statement
from kvpreflight.record.verify import (
    Policy,
    VerifiedAttestation,
    VerifiedRecord,
    parse_duration,
    parse_required,
    summary,
    verify_attestation,
    verify_envelope,
)
from kvpreflight.record.verify_options import VerifyOptions, VerifyPlan, build_verify_plan

__all__ = [
    "FLEET_PREDICATE_TYPE", "IN_TOTO_PAYLOAD_TYPE", "PASSWORD_ENV", "PREDICATE_TYPE", "SIGN_KEY_ENV", "STATEMENT_TYPE",
    "Envelope", "FleetDeployment", "FleetPredicate", "Policy", "ReleasePredicate", "PublicKey", "RecordError", "SigningKey", "Subject",
    "VerifiedAttestation", "VerifiedRecord", "VerifyOptions", "VerifyPlan", "build_verify_plan", "verify_files",
    "build_statement", "emit_record", "parse_subjects", "prepare_signer", "file_subject", "generate", "load_public_key", "load_signing_key",
    "pae",
    "parse_duration", "parse_required", "parse_subject", "read_record", "redact_command_line", "resolve_sign_key_path",
    "sign_statement", "statement", "summary", "unsigned_envelope", "verify_attestation", "verify_envelope", "write_keypair", "write_record",
]
