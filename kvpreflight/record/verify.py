"""Verify a release record against a public key and a release policy.

Order: the envelope's payloadType, the signature over the PAE, the statement and predicate types
(these are gates: nothing else is trusted before they pass), then subjects, the predicate read by
its typed reader (the one `watch` uses; a predicate that does not read is refused naming every value
that does not, and nothing in it is judged), age and verdict. Every refusal names the condition that
failed (exit 1); bad input is exit 2.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kvpreflight._internal.check_ids import CHECK_IDS, CheckId
from kvpreflight._internal.files import FileKind, sha256_of
from kvpreflight._internal.redact import cut
from kvpreflight.model import EngineSnapshot, Report, Status, Waiver
from kvpreflight.record.attest import (
    TEST_RESULT_PREDICATE_TYPE,
    VERIFIER_ID,
    VSA_PREDICATE_TYPE,
    TestOutcome,
    level_of,
    named_check,
    undecided,
)
from kvpreflight.record.dsse import IN_TOTO_PAYLOAD_TYPE, DuplicateKey, Envelope, loads_unique
from kvpreflight.record.errors import RecordError, refusal
from kvpreflight.record.keys import PublicKey
from kvpreflight.record.predicate import (
    FLEET_PREDICATE_TYPE,
    PREDICATE_TYPE,
    FleetPredicate,
    Predicate,
    ReleasePredicate,
    predicate_from_dict,
)
from kvpreflight.record.statement import STATEMENT_TYPE, Subject, subjects_of

DEFAULT_MAX_AGE = "24h"
# A release must have proved these, not skipped, waived or failed to measure them (verify --require).
DEFAULT_REQUIRED = (CheckId.KV_CAPACITY, CheckId.OVERCAPACITY_REJECTED, CheckId.TENANT_ISOLATION)
# A fleet record's subjects name each deployment's record file with this prefix.
RECORD_SUBJECT_PREFIX = "record:"
FUTURE_SKEW = timedelta(minutes=5)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``24h``, ``7d``. Anything else is a usage error (exit 2)."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", text or "")
    if match is None or int(match.group(1)) == 0:
        raise RecordError(f"--max-age {text!r} is not a duration; use a positive number with a unit s, m, h or d, e.g. --max-age 24h")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def parse_required(values: list[str] | None) -> tuple[str, ...]:
    """--require values: check ids (repeatable or comma-separated), or `none`; none given: the default."""
    if not values:
        return DEFAULT_REQUIRED
    ids = [part.strip() for value in values for part in value.split(",") if part.strip()]
    if ids == ["none"]:
        return ()
    unknown = [i for i in ids if i not in CHECK_IDS]
    if unknown or not ids:
        raise RecordError(f"--require {', '.join(unknown) or values}: not a check id; use one of {', '.join(CHECK_IDS)}, or none")
    return tuple(dict.fromkeys(ids))


def format_duration(delta: timedelta) -> str:
    """A human duration in the unit a user would write: 45s, 90m, 30h, 3d, 1.5d."""
    seconds = abs(delta.total_seconds())
    for unit, size, below in (("s", 1, 120), ("m", 60, 120 * 60), ("h", 3600, 48 * 3600)):
        if seconds < below:
            return _number(seconds / size) + unit
    return _number(seconds / 86400) + "d"


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


@dataclass(frozen=True)
class Policy:
    """What a record must satisfy besides being authentic."""

    subjects: tuple[Subject, ...] = ()
    any_subject: bool = False
    max_age: timedelta = timedelta(hours=24)
    allow_fail: bool = False
    required: tuple[str, ...] = DEFAULT_REQUIRED  # check ids that must have run and decided (none under allow_fail)
    expect_model: str | None = None  # every engine must report serving this model
    expect_engine_version: str | None = None  # every engine must report this version
    allow_warned: bool = False  # a Test Result may say WARNED (skips, waivers, warnings), not only PASSED
    resource_uri: str | None = None  # a VSA must be about this resource

    def __post_init__(self) -> None:
        if not self.subjects and not self.any_subject:
            raise RecordError("verify needs at least one --subject NAME=sha256:HEX (the artifact you are releasing); "
                              "pass --any-subject to accept a record about any artifact")


@dataclass(frozen=True)
class VerifiedRecord:
    """A kvpreflight record `verify` accepted, its predicate typed (read by `predicate_from_dict`)."""

    keyid: str
    time: datetime
    subjects: tuple[Subject, ...]
    predicate: Predicate

    @property
    def verdict(self) -> Status:
        return self.predicate.verdict

    @property
    def predicate_type(self) -> str:
        return self.predicate.predicate_type

    @property
    def is_fleet(self) -> bool:
        return isinstance(self.predicate, FleetPredicate)

    @property
    def engines(self) -> tuple[EngineSnapshot, ...]:
        """The engines a release record names (a fleet record names deployments instead)."""
        return self.predicate.report.engines if isinstance(self.predicate, ReleasePredicate) else ()


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _check_signature(envelope: Envelope, key: PublicKey) -> str:
    if not envelope.signatures:
        raise refusal("record is unsigned (written with --unsigned); a release needs a record signed with --sign-key")
    if envelope.payload_type != IN_TOTO_PAYLOAD_TYPE:
        raise refusal(f"payloadType is {envelope.payload_type!r}, expected {IN_TOTO_PAYLOAD_TYPE!r}; not a kvpreflight record, or altered")
    named = [s for s in envelope.signatures if s.keyid]
    if named and all(s.keyid not in key.keyids for s in named) and len(named) == len(envelope.signatures):
        ids = ", ".join(sorted({s.keyid[:16] for s in named}))
        raise refusal(f"record is signed by keyid {ids}…, not by the --key {key.source} (keyid {key.keyid[:16]}…); "
                      "wrong key or a record from another signer")
    data = envelope.pae()
    for s in envelope.signatures:
        if (not s.keyid or s.keyid in key.keyids) and key.verify(s.sig, data):
            return key.keyid
    raise refusal(f"signature does not verify with {key.source}: the payload or the signature was altered after signing")


RECORD_TYPES = (PREDICATE_TYPE, FLEET_PREDICATE_TYPE)
ATTESTATION_TYPES = (*RECORD_TYPES, TEST_RESULT_PREDICATE_TYPE, VSA_PREDICATE_TYPE)


def _statement(envelope: Envelope, accepted: tuple[str, ...] = RECORD_TYPES) -> dict[str, Any]:
    try:
        statement = loads_unique(envelope.payload)
    except DuplicateKey as exc:
        raise refusal(f"the signed statement names the key {cut(str(exc), 60)!r} twice in one object; "
                      "another verifier could read another statement") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise refusal("signed payload is not JSON; not a kvpreflight record") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        got = statement.get("_type") if isinstance(statement, dict) else type(statement).__name__
        raise refusal(f"statement type is {got!r}, expected {STATEMENT_TYPE!r}")
    if statement.get("predicateType") not in accepted:
        what = "a kvpreflight release record" if accepted == RECORD_TYPES else "a kvpreflight record, Test Result or Verification Summary"
        raise refusal(f"predicateType is {statement.get('predicateType')!r}, expected {' or '.join(map(repr, accepted))}; not {what}")
    if not isinstance(statement.get("predicate"), dict) or not isinstance(statement.get("subject"), list):
        raise refusal("statement has no predicate object or subject list")
    return statement


def verify_envelope(envelope: Envelope, key: PublicKey, policy: Policy, *, now: datetime | None = None) -> VerifiedRecord:
    """Accept the record or raise RecordError(exit 1) naming every condition that failed."""
    keyid = _check_signature(envelope, key)
    statement = _statement(envelope)
    recorded = subjects_of(statement)
    problems = _subject_problems(recorded, policy)
    try:
        predicate = predicate_from_dict(statement["predicateType"], statement["predicate"])
    except RecordError as exc:  # every value that does not read, or a newer schema: nothing in it is judged
        raise refusal("; ".join([*problems, str(exc)])) from None
    now = now or datetime.now(UTC)
    moment, late = _age(predicate.time, now, policy, "record")
    problems += late
    if predicate.verdict is not Status.PASS and not policy.allow_fail:
        problems.append(f"verdict is {predicate.verdict.value!r}, not 'pass'{_not_passed(predicate)}; "
                        "pass --allow-fail to check authenticity only")
    if isinstance(predicate, ReleasePredicate):
        if not policy.allow_fail:
            problems += _unproved(predicate.report, policy.required)
        problems += _expired_waivers(predicate.report.waivers, now)
        problems += _engines_mismatch(predicate.report.engines, policy)
    if problems or moment is None:
        raise refusal("; ".join(problems))
    return VerifiedRecord(keyid=keyid, time=moment, subjects=recorded, predicate=predicate)


def _not_passed(predicate: Predicate) -> str:
    """What made a verdict other than pass: the checks, or a fleet's deployments."""
    if isinstance(predicate, FleetPredicate):
        deployments = [f"{d.name} {d.verdict.value}" for d in predicate.deployments if d.verdict is not Status.PASS]
        return f" (deployments: {', '.join(deployments)})" if deployments else ""
    checks = [c.id for c in predicate.report.checks if c.status in (Status.FAIL, Status.INCONCLUSIVE)]
    return f" (checks: {', '.join(checks)})" if checks else ""


def _subject_problems(recorded: tuple[Subject, ...], policy: Policy) -> list[str]:
    by_name = {s.name: s for s in recorded}
    problems = []
    for want in policy.subjects:
        have = by_name.get(want.name)
        if have is None:
            names = ", ".join(sorted(by_name)) or "none"
            problems.append(f"subject {want.name} is not in the record (it names: {names})")
        elif have.sha256 != want.sha256:
            problems.append(f"subject {want.name} has digest sha256:{have.sha256} in the record, not sha256:{want.sha256}")
    return problems


def _age(value: Any, now: datetime, policy: Policy, what: str) -> tuple[datetime | None, list[str]]:
    """When `value` (RFC 3339) was, and why that is too old or in the future (empty: fine)."""
    moment = _parse_time(value)
    if moment is None:
        return None, [f"{what} time {value!r} is missing or not RFC 3339"]
    age = now - moment
    if age < -FUTURE_SKEW:
        return moment, [f"{what} is dated {format_duration(age)} in the future ({value}); check the signer's clock"]
    if age > policy.max_age:
        return moment, [f"{what} is {format_duration(age)} old, older than --max-age {format_duration(policy.max_age)} ({value}); "
                        "run the preflight again"]
    return moment, []


@dataclass(frozen=True)
class VerifiedAttestation:
    """A Test Result or a Verification Summary that `verify` accepted."""

    keyid: str
    predicate_type: str
    subjects: tuple[Subject, ...]
    predicate: Mapping[str, Any]


def verify_attestation(envelope: Envelope, key: PublicKey, policy: Policy, *,
                       now: datetime | None = None) -> VerifiedRecord | VerifiedAttestation:
    """Any of the three kinds kvpreflight writes: its own record (as :func:`verify_envelope`), an
    in-toto Test Result (PASSED, or WARNED with `allow_warned`; every required check passed) or a
    SLSA Verification Summary (by kvpreflight's verifier, PASSED, recent, about `resource_uri`,
    every required check's level). Each is signature-checked by `key` and held to `policy`'s subjects."""
    keyid = _check_signature(envelope, key)
    statement = _statement(envelope, ATTESTATION_TYPES)
    kind = statement["predicateType"]
    if kind in RECORD_TYPES:
        return verify_envelope(envelope, key, policy, now=now)
    predicate = statement["predicate"]
    recorded = subjects_of(statement)
    problems = _subject_problems(recorded, policy)
    if kind == TEST_RESULT_PREDICATE_TYPE:
        problems += _test_result_problems(predicate, policy)
    else:
        problems += _summary_problems(predicate, policy, now or datetime.now(UTC))
    if problems:
        raise refusal("; ".join(problems))
    return VerifiedAttestation(keyid=keyid, predicate_type=kind, subjects=recorded, predicate=predicate)


def _names(predicate: Mapping[str, Any], field: str) -> list[str] | None:
    value = predicate.get(field, [])
    return [str(v) for v in value] if isinstance(value, list) else None


def _test_result_problems(predicate: Mapping[str, Any], policy: Policy) -> list[str]:
    result = predicate.get("result")
    lists = {f: _names(predicate, f) for f in ("passedTests", "warnedTests", "failedTests")}
    if result not in set(TestOutcome) or not isinstance(predicate.get("configuration"), list) or None in lists.values():
        return [f"Test Result is malformed (result {result!r}; configuration and the test lists must be lists)"]
    if policy.allow_fail:
        return []
    problems = []
    accepted = (TestOutcome.PASSED, TestOutcome.WARNED) if policy.allow_warned else (TestOutcome.PASSED,)
    if result not in accepted:
        not_passed = [*(lists["failedTests"] or []), *(lists["warnedTests"] or [])]
        hint = "; pass --allow-warned to accept skips, waivers and warnings" if result == TestOutcome.WARNED else ""
        problems.append(f"Test Result is {result}, not {' or '.join(accepted)} (tests: {', '.join(not_passed) or 'none'}){hint}")
    for check_id in policy.required:
        # With --allow-warned a required check that warned has decided, as in the record beside it;
        # one skipped or waived has not.
        warned = [n for n in lists["warnedTests"] or [] if named_check(n, check_id)]
        decided = [n for n in warned if policy.allow_warned and not undecided(n)]
        passed = [n for n in lists["passedTests"] or [] if named_check(n, check_id)] + decided
        other = [n for n in warned if n not in decided] + [n for n in lists["failedTests"] or [] if named_check(n, check_id)]
        if not passed or other:
            problems.append(f"required check {check_id} did not pass in the Test Result"
                            f"{' (' + ', '.join(other) + ')' if other else ' (not among passedTests)'}")
    return problems


def _summary_problems(predicate: Mapping[str, Any], policy: Policy, now: datetime) -> list[str]:
    verifier = predicate.get("verifier")
    problems = []
    if not isinstance(verifier, dict) or verifier.get("id") != VERIFIER_ID:
        got = verifier.get("id") if isinstance(verifier, dict) else verifier
        problems.append(f"Verification Summary verifier is {got!r}, not {VERIFIER_ID!r}")
    problems += _age(predicate.get("timeVerified"), now, policy, "Verification Summary")[1]
    if policy.resource_uri is not None and predicate.get("resourceUri") != policy.resource_uri:
        problems.append(f"Verification Summary is about {predicate.get('resourceUri')!r}, not --resource-uri {policy.resource_uri!r}")
    if policy.allow_fail:
        return problems
    if predicate.get("verificationResult") != TestOutcome.PASSED:
        problems.append(f"verificationResult is {predicate.get('verificationResult')!r}, not 'PASSED'")
    levels = predicate.get("verifiedLevels")
    levels = levels if isinstance(levels, list) else []
    missing = [level_of(c) for c in policy.required if level_of(c) not in levels]
    if missing:
        problems.append(f"verifiedLevels lack {', '.join(missing)} (the --require checks)")
    return problems


def _unproved(report: Report, required: tuple[str, ...]) -> list[str]:
    """A required check that is absent, skipped, waived or inconclusive proved nothing: a record
    of a --capacity-only run or a waived isolation check must not pass the gate."""
    out = []
    for check_id in required:
        found = [c for c in report.checks if c.id == check_id]
        if not found:
            out.append(f"required check {check_id} is not in the record")
        for c in found:
            if c.waiver is not None:
                out.append(f"required check {check_id} was waived ({c.waiver})")
            elif c.status in (Status.SKIP, Status.INCONCLUSIVE):
                where = f" at {c.endpoint}" if c.endpoint else ""
                out.append(f"required check {check_id} is {c.status.value}{where}: {c.message}")
    return out


def _engines_mismatch(engines: tuple[EngineSnapshot, ...], policy: Policy) -> list[str]:
    out = []
    for flag, what, want in (("--expect-model", "model", policy.expect_model),
                             ("--expect-engine-version", "version", policy.expect_engine_version)):
        if want is None:
            continue
        if not engines:
            out.append(f"{flag} {want}: the record names no engine")
        for e in engines:
            have = e.model if what == "model" else e.version
            if have != want:
                out.append(f"engine {e.url} reported {what} {have!r}, not {want!r} ({flag})")
    return out


def _expired_waivers(waivers: tuple[Waiver, ...], now: datetime) -> list[str]:
    out = []
    for w in waivers:
        if w.until is None:
            continue
        until = _parse_time(f"{w.until}T23:59:59Z")  # a waiver holds through its last day
        if until is None:
            out.append(f"waiver of {w.check_id} has an unreadable expiry {w.until!r}")
        elif until < now:
            out.append(f"waiver of {w.check_id} expired on {w.until} ({w.reason}); fix the check or renew the waiver")
    return out


def summary(record: VerifiedRecord, *, path: str, now: datetime | None = None) -> str:
    """What `kvpreflight verify` prints for a record it accepted: verdict, subjects, engines, waivers."""
    now = now or datetime.now(UTC)
    p = record.predicate
    version = p.tool_version if isinstance(p, FleetPredicate) else p.report.tool_version
    lines = [
        f"verified {path}",
        f"  signed by  keyid {record.keyid[:16]}…",
        f"  verdict    {record.verdict.value}",
        f"  time       {p.time} ({format_duration(now - record.time)} ago) on {p.host}",
        f"  tool       kvpreflight {version or None}",
    ]
    for i, s in enumerate(record.subjects):
        lines.append(f"  {'subjects' if i == 0 else '':<10} {s.name}=sha256:{s.sha256[:16]}…")
    for i, e in enumerate(record.engines):
        desc = (f"{e.engine} {e.version or ''} {e.role.value} at {e.url}: model {e.model}, "
                f"pool {e.pool_tokens()} tokens, context served {e.served_context}")
        lines.append(f"  {'engines' if i == 0 else '':<10} {' '.join(desc.split())}")
    for i, d in enumerate(p.deployments if isinstance(p, FleetPredicate) else ()):
        lines.append(f"  {'fleet' if i == 0 else '':<10} {d.name}: {d.verdict.value} ({d.record})")
    if not record.engines and not record.is_fleet:
        lines.append("  engines    none recorded")
    return "\n".join(lines) + "\n"


def verify_deep(record: VerifiedRecord, directory: Path, key: PublicKey, policy: Policy, *,
                now: datetime | None = None) -> list[tuple[str, VerifiedRecord]]:
    """Verify every deployment record a fleet record names: present in `directory`, byte for byte
    the file the fleet record's digest names, and itself accepted by `policy` with `key`.
    Every deployment the fleet record lists must have its record among the subjects."""
    from kvpreflight.record.sign import read_record

    if not record.is_fleet:
        raise RecordError("--deep needs a fleet record (written by `kvpreflight fleet --record`); this is a single deployment's record")
    if not directory.is_dir():
        raise RecordError(f"--deep {directory}: not a folder; pass the folder holding the deployment records")
    named = {s.name[len(RECORD_SUBJECT_PREFIX):]: s.sha256 for s in record.subjects if s.name.startswith(RECORD_SUBJECT_PREFIX)}
    problems: list[str] = []
    for d in record.predicate.deployments if isinstance(record.predicate, FleetPredicate) else ():
        if d.record is None or d.record not in named:
            problems.append(f"deployment {d.name} has no record among the fleet record's subjects")
    verified: list[tuple[str, VerifiedRecord]] = []
    for name, digest in sorted(named.items()):
        path = directory / name
        if os.path.basename(name) != name or not path.is_file():
            problems.append(f"{name}: not found in {directory}")
            continue
        actual = sha256_of(path, FileKind.RECORD, RecordError)
        if actual != digest:
            problems.append(f"{name}: sha256 {actual[:16]}… is not the {digest[:16]}… the fleet record names (changed after signing)")
            continue
        try:
            verified.append((name, verify_envelope(read_record(path), key, policy, now=now)))
        except RecordError as exc:
            problems.append(f"{name}: {exc}")
    if not named:
        problems.append("the fleet record names no deployment record")
    if problems:
        raise refusal("; ".join(problems))
    return verified


def authentic_subjects(envelope: Envelope, key: PublicKey) -> tuple[Subject, ...] | None:
    """The subjects of a release record whose signature and types hold, refused or not (a refused
    one still gets a FAILED Verification Summary); None when nothing in it can be trusted."""
    try:
        _check_signature(envelope, key)
        return subjects_of(_statement(envelope, (PREDICATE_TYPE,)))
    except RecordError:
        return None
