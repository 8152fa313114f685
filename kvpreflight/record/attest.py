"""The two standard attestations written beside kvpreflight's own record, for tools that read only
the standard shapes:

- an in-toto Test Result (https://in-toto.io/attestation/test-result/v0.1), one per `check` run,
  about the same subjects as the record, one test name per check result;
- a SLSA Verification Summary (https://slsa.dev/verification_summary/v1), written by `verify`
  about a release record it judged, with kvpreflight's own ``KVPREFLIGHT_...`` levels (the
  specification reserves the ``SLSA_`` prefix for SLSA's tracks).

Both go through the one statement builder (redaction) and the one DSSE signer.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kvpreflight._internal.check_ids import CheckId
from kvpreflight.model import CheckResult, Report, Status
from kvpreflight.record.statement import Subject, file_subject

if TYPE_CHECKING:
    from kvpreflight.record.keys import SigningKey
    from kvpreflight.record.verify import Policy

TEST_RESULT_PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
VSA_PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
# Who judged: `verify` of this tool. Versioned in verifier.version, as the SLSA spec asks.
VERIFIER_ID = "https://kvpreflight.dev/verifier/verify"
# What the VSA's policy digest covers: the check data (thresholds, advisories) and verify's options.
POLICY_URI = "https://kvpreflight.dev/verify-policy/v1"
BUILTIN_PREFIX = "kvpreflight:checks/"
# A VSA level per required check; other check ids get KVPREFLIGHT_<ID>_VERIFIED.
LEVELS: dict[str, str] = {
    CheckId.KV_CAPACITY: "KVPREFLIGHT_CAPACITY_VERIFIED",
    CheckId.OVERCAPACITY_REJECTED: "KVPREFLIGHT_OVERCAPACITY_REJECTED",
    CheckId.TENANT_ISOLATION: "KVPREFLIGHT_TENANT_ISOLATION_VERIFIED",
}
# Every VSA that passed carries this: signature, subjects, age and verdict were checked.
RECORD_LEVEL = "KVPREFLIGHT_RECORD_VERIFIED"
FAILED_LEVEL = "FAILED"  # the SLSA spec's SlsaResult for a failed verification


class TestOutcome(enum.StrEnum):
    """The Test Result predicate's `result` (and the VSA's `verificationResult`, PASSED|FAILED)."""

    __test__ = False  # not a pytest class

    PASSED = "PASSED"
    WARNED = "WARNED"
    FAILED = "FAILED"


def level_of(check_id: str) -> str:
    return LEVELS.get(check_id, f"KVPREFLIGHT_{check_id.upper().replace('-', '_')}_VERIFIED")


# A warnedTests name for a check that decided nothing carries one of these marks; a plain name
# there is a warning, which decided (as our record's verify reads it).
SKIPPED_MARK, WAIVED_MARK = " [skipped]", " [waived]"


def test_name(check: CheckResult) -> str:
    """One test per check result: its id, the endpoint when the check ran per engine, and a mark
    when it was skipped or waived."""
    name = f"{check.id} ({check.endpoint})" if check.endpoint else check.id
    if check.status is Status.SKIP:
        name += WAIVED_MARK if check.waiver is not None else SKIPPED_MARK
    return name


def undecided(name: str) -> bool:
    return name.endswith((SKIPPED_MARK, WAIVED_MARK))


def named_check(name: str, check_id: str) -> bool:
    return name == check_id or name.startswith((f"{check_id} (", f"{check_id} ["))


def resource(name: str, path: str | os.PathLike[str]) -> dict[str, Any]:
    """An in-toto ResourceDescriptor: the name and the sha256 of the file's bytes."""
    return {"name": name, "digest": {"sha256": file_subject(path).sha256}}


def configuration_files(advisory_dirs: Sequence[Path] = (), spec: Path | None = None) -> tuple[tuple[str, Path], ...]:
    """What a check read as configuration, named as a user would recognise it: kvpreflight's
    thresholds and advisories (``kvpreflight:checks/...``), each extra advisory file, the boot spec."""
    from kvpreflight._internal.checkdata import data_dir
    from kvpreflight._internal.checks.advisory_data import advisory_files

    data = data_dir()
    out = [(f"{BUILTIN_PREFIX}thresholds.yaml", data / "thresholds.yaml")]
    out += [(f"{BUILTIN_PREFIX}advisories/{p.name}", p) for p in advisory_files(data / "advisories")]
    for folder in advisory_dirs:
        out += [(str(p), p) for p in advisory_files(folder)]
    if spec is not None:
        out.append((str(spec), spec))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class TestResultPredicate:
    """One `check` run as an in-toto Test Result: PASSED only for a pass with nothing to note;
    WARNED for a pass with a warning, a skip or a waiver; FAILED for anything else (a fail, or a
    check that could not be measured)."""

    __test__ = False  # not a pytest class
    predicate_type: ClassVar[str] = TEST_RESULT_PREDICATE_TYPE

    result: TestOutcome
    configuration: tuple[Mapping[str, Any], ...]
    passed: tuple[str, ...]
    warned: tuple[str, ...]
    failed: tuple[str, ...]

    @classmethod
    def of(cls, report: Report, configuration: Iterable[tuple[str, Path]]) -> TestResultPredicate:
        def names(*statuses: Status) -> tuple[str, ...]:
            return tuple(test_name(c) for c in report.checks if c.status in statuses)

        passed = names(Status.PASS)
        warned = names(Status.WARN, Status.SKIP)  # a waived check is a skip that carries its waiver
        failed = names(Status.FAIL, Status.INCONCLUSIVE)
        if report.verdict is not Status.PASS:
            result = TestOutcome.FAILED
        else:
            result = TestOutcome.WARNED if warned or report.waivers else TestOutcome.PASSED
        return cls(result=result, configuration=tuple(resource(name, path) for name, path in configuration),
                   passed=passed, warned=warned, failed=failed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": self.result.value,
            "configuration": [dict(c) for c in self.configuration],
            "passedTests": list(self.passed),
            "warnedTests": list(self.warned),
            "failedTests": list(self.failed),
        }


def policy_descriptor(*, required: Sequence[str], max_age_s: float, expect_model: str | None,
                      expect_engine_version: str | None) -> dict[str, Any]:
    """The VSA's `policy`: what `verify` judged against, by digest: kvpreflight's thresholds and
    advisories (by their own digests) and the options that decide (required checks, age, engine)."""
    document = {
        "check_data": [resource(name, path) for name, path in configuration_files()],
        "require": list(required),
        "max_age_s": max_age_s,
        "expect_model": expect_model,
        "expect_engine_version": expect_engine_version,
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return {"uri": POLICY_URI, "digest": {"sha256": hashlib.sha256(canonical.encode()).hexdigest()}}


@dataclass(frozen=True, kw_only=True)
class VerificationSummaryPredicate:
    """A SLSA VSA: `verify`'s decision on one release record, for admission controllers that read VSAs."""

    predicate_type: ClassVar[str] = VSA_PREDICATE_TYPE

    tool_version: str
    time_verified: str
    resource_uri: str
    policy: Mapping[str, Any]
    input_attestation: Subject  # the record file that was judged, by digest
    passed: bool
    levels: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verifier": {"id": VERIFIER_ID, "version": {"kvpreflight": self.tool_version}},
            "timeVerified": self.time_verified,
            "resourceUri": self.resource_uri,
            "policy": dict(self.policy),
            "inputAttestations": [{"name": self.input_attestation.name,
                                   "digest": {"sha256": self.input_attestation.sha256}}],
            "verificationResult": (TestOutcome.PASSED if self.passed else TestOutcome.FAILED).value,
            "verifiedLevels": list(self.levels) if self.passed else [FAILED_LEVEL],
        }


StandardPredicate = TestResultPredicate | VerificationSummaryPredicate


def write_summary(out: str | os.PathLike[str], *, record_path: str | os.PathLike[str], subjects: Sequence[Subject],
                  policy: Policy, passed: bool, resource_uri: str, signer: SigningKey,
                  command_line: Sequence[str], now: datetime | None = None) -> Path:
    """Sign and write the VSA for the record at `record_path`: PASSED with a level per required
    check when `verify` accepted it under `policy`, else FAILED."""
    from kvpreflight import __version__
    from kvpreflight._internal.clock import rfc3339
    from kvpreflight.record.sign import sign_statement, write_record
    from kvpreflight.record.statement import statement

    predicate = VerificationSummaryPredicate(
        tool_version=__version__, time_verified=rfc3339(now or datetime.now(UTC)), resource_uri=resource_uri,
        policy=policy_descriptor(required=policy.required, max_age_s=policy.max_age.total_seconds(),
                                 expect_model=policy.expect_model, expect_engine_version=policy.expect_engine_version),
        input_attestation=Subject(name=str(record_path), sha256=file_subject(record_path).sha256),
        passed=passed, levels=(RECORD_LEVEL, *(level_of(c) for c in policy.required)),
    )
    return write_record(out, sign_statement(statement(predicate, subjects=subjects, command_line=command_line), signer))
