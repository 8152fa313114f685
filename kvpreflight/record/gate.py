"""The release gate `kvpreflight verify` runs: each file of a `VerifyPlan` verified against its key
and policy, `OK: FILE` or `FAIL: FILE: reason` said for each, a record's summary shown, a fleet
record's deployment records verified with `--deep`, and a Verification Summary written with
`--vsa`. Returns the exit code (0 every file accepted, 1 one refused); bad input raises RecordError
(exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvpreflight.record.dsse import Envelope
from kvpreflight.record.errors import RecordError, RecordRefused
from kvpreflight.record.verify import VerifiedRecord, summary, verify_attestation, verify_deep
from kvpreflight.record.verify_options import SummaryPlan, VerifyPlan

__all__ = ["verify_files"]

Write = Callable[[str], object]


def verify_files(plan: VerifyPlan, *, out: Write, err: Write) -> int:
    """`out` gets each accepted record's summary (the report), `err` the OK/FAIL lines (progress)."""
    from kvpreflight.record.attest import VSA_PREDICATE_TYPE
    from kvpreflight.record.sign import read_record

    refused = saw_record = saw_summary = False
    for record in plan.records:
        envelope = read_record(record)
        deep_records: list[tuple[str, VerifiedRecord]] = []
        try:
            verified = verify_attestation(envelope, plan.key, plan.policy)
            if plan.deep is not None and isinstance(verified, VerifiedRecord):
                deep_records = verify_deep(verified, plan.deep, plan.key, plan.policy)
        except RecordRefused as exc:
            refused = True
            if plan.summary is not None:
                _write_summary(plan, plan.summary, record, envelope, passed=False, err=err)
            err(f"FAIL: {record}: {' '.join(str(exc).split())}\n")
            continue
        if isinstance(verified, VerifiedRecord):
            if plan.summary is not None:
                if verified.is_fleet:
                    raise RecordError("--vsa summarizes a release record; this is a fleet record")
                _write_summary(plan, plan.summary, record, envelope, passed=True, err=err)
            out(summary(verified, path=str(record)))
            for name, one in deep_records:
                out(f"  {'deep' if name == deep_records[0][0] else '':<10} {name}: verified, verdict {one.verdict.value}, "
                    f"{len(one.engines)} engine(s)\n")
            saw_record = True
        elif plan.deep is not None or plan.summary is not None:
            flag = "--deep" if plan.deep is not None else "--vsa"
            raise RecordError(f"{flag} needs a kvpreflight record; {record} is a {verified.predicate_type}")
        else:
            saw_summary = saw_summary or verified.predicate_type == VSA_PREDICATE_TYPE
        err(f"OK: {record}\n")
    # An option that no file let us check is not a pass: say so.
    if plan.needs_record and not saw_record and not refused:
        err("FAIL: --expect-model and --expect-engine-version are checked in a kvpreflight record; pass the record too\n")
        refused = True
    if plan.needs_summary and not saw_summary and not refused:
        err("FAIL: --resource-uri is checked in a Verification Summary (or written into one with --vsa); none was given\n")
        refused = True
    return 1 if refused else 0


def _write_summary(plan: VerifyPlan, vsa: SummaryPlan, record: Path, envelope: Envelope, *, passed: bool, err: Write) -> None:
    """The VSA of `record`; a record whose signature or type does not hold gets none (its subjects
    cannot be trusted), and FAIL says so."""
    from kvpreflight.record.attest import write_summary
    from kvpreflight.record.verify import authentic_subjects

    subjects = authentic_subjects(envelope, plan.key)
    if subjects is None:
        err(f"kvpreflight: no Verification Summary written: {record} is not a release record whose signature holds\n")
        return
    write_summary(vsa.path, record_path=record, subjects=subjects, policy=plan.policy, passed=passed, resource_uri=vsa.resource_uri,
                  signer=vsa.signer, command_line=vsa.command_line)
    err(f"kvpreflight: Verification Summary ({'PASSED' if passed else 'FAILED'}) written to {vsa.path}\n")
