"""`kvpreflight verify`: the release gate for signed records, in-toto Test Results and SLSA
Verification Summaries. Never imports torch or an engine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvpreflight.commands import options

if TYPE_CHECKING:
    from kvpreflight.record import Envelope, Policy, PublicKey, SigningKey


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify(
        records: list[Path] = typer.Argument(..., metavar="RECORD",
            help="Files to verify: records written by `check --record` (or `fleet --record`), Test Results (`check --test-result`), "
                 "Verification Summaries (`verify --vsa`)."),
        key: Path = typer.Option(..., "--key", help="The signer's public key (kvpreflight.pub)."),
        # A subject the record must name, not one written into it as check's --subject is.
        subject: list[str] | None = typer.Option(None, "--subject",
            help="NAME=sha256:HEX that must be in the record with exactly this digest. Repeatable."),
        max_age: str = typer.Option("24h", "--max-age",
            help="Refuse a record or Verification Summary older than this (s, m, h, d); a Test Result carries no time: verify it with "
                 "its record."),
        allow_fail: bool = typer.Option(False, "--allow-fail", help="Check authenticity, subjects and age only; accept any verdict."),
        require_pass: bool = typer.Option(False, "--require-pass", help="Require the verdict pass (the default; for explicit pipelines)."),
        any_subject: bool = typer.Option(False, "--any-subject", help="Accept a record without naming a --subject."),
        require: list[str] | None = typer.Option(None, "--require",
            help="A check id that must have run and decided (not skip, waived or inconclusive). Repeatable; default kv-capacity, "
                 "overcapacity-rejected, tenant-isolation; 'none' requires nothing."),
        expect_model: str | None = typer.Option(None, "--expect-model",
            help="Refuse the record unless every engine in it reported serving this model."),
        expect_engine_version: str | None = typer.Option(None, "--expect-engine-version",
            help="Refuse the record unless every engine in it reported this version."),
        deep: Path | None = typer.Option(None, "--deep",
            help="RECORD is a fleet record: also verify every deployment record it names, found in this folder, by digest, key and "
                 "the same policy."),
        allow_warned: bool = typer.Option(False, "--allow-warned",
            help="Accept a Test Result that says WARNED (a warning, skip or waiver), not only PASSED; --require still applies."),
        vsa: Path | None = typer.Option(None, "--vsa",
            help="Also write a SLSA Verification Summary of RECORD here (PASSED only if it is accepted), signed with --sign-key; "
                 "needs --resource-uri."),
        resource_uri: str | None = typer.Option(None, "--resource-uri",
            help="With --vsa: the resource the summary is about (image or deployment URI). Verifying a summary: the resource it must "
                 "be about."),
        sign_key: str | None = options.in_panel(options.SIGN_KEY, None),
        allow_insecure_key: bool = options.in_panel(options.ALLOW_INSECURE_KEY, None),
    ) -> None:
        """Exit 0 only if every file is signed by --key, names every --subject with its digest, is recent enough and passed.

        Prints OK: FILE or FAIL: FILE: reason for each. Exit 1: refused (the reason names the condition). \
Exit 2: bad input (missing or malformed file or key, bad option).
        """
        from kvpreflight.record import (
            Policy,
            RecordError,
            load_public_key,
            parse_duration,
            parse_required,
            parse_subjects,
            read_record,
            summary,
        )
        from kvpreflight.record.attest import VSA_PREDICATE_TYPE
        from kvpreflight.record.errors import RecordRefused
        from kvpreflight.record.verify import VerifiedRecord, verify_attestation

        if allow_fail and require_pass:
            raise RecordError("--allow-fail and --require-pass contradict each other; pass one")
        signer = None
        if vsa is not None:
            from kvpreflight.record.keys import load_signing_key, resolve_sign_key_path

            if len(records) != 1 or deep is not None:
                raise RecordError("--vsa summarizes one release record; pass one RECORD and no --deep")
            if allow_fail:
                raise RecordError("--vsa says whether RECORD passed verify's policy; drop --allow-fail")
            if not resource_uri:
                raise RecordError("--vsa needs --resource-uri URI: the image or deployment the summary is about")
            from kvpreflight.files import check_writable

            check_writable(vsa, "--vsa", RecordError)
            path = resolve_sign_key_path(sign_key)
            if path is None:
                raise RecordError("--vsa needs --sign-key PATH (or KVPREFLIGHT_SIGN_KEY=PATH): the summary is signed")
            signer = load_signing_key(path, allow_insecure=allow_insecure_key)
        elif sign_key:
            raise RecordError("--sign-key only makes sense with --vsa FILE")
        policy = Policy(
            subjects=tuple(parse_subjects(subject)),
            any_subject=any_subject,
            max_age=parse_duration(max_age),
            allow_fail=allow_fail,
            required=parse_required(require),
            expect_model=expect_model,
            expect_engine_version=expect_engine_version,
            allow_warned=allow_warned,
            resource_uri=None if vsa is not None else resource_uri,
        )
        public = load_public_key(key)
        refused = saw_record = saw_summary = False
        for record in records:
            envelope = read_record(record)
            deep_records = []
            try:
                verified = verify_attestation(envelope, public, policy)
                if deep is not None and isinstance(verified, VerifiedRecord):
                    from kvpreflight.record.verify import verify_deep

                    deep_records = verify_deep(verified, deep, public, policy)
            except RecordRefused as exc:
                refused = True
                if vsa is not None and signer is not None and resource_uri:
                    _write_summary(vsa, record, envelope, public, policy, signer, resource_uri, passed=False)
                sys.stderr.write(f"FAIL: {record}: {' '.join(str(exc).split())}\n")
                continue
            if isinstance(verified, VerifiedRecord):
                if vsa is not None and signer is not None and resource_uri:
                    if verified.is_fleet:
                        raise RecordError("--vsa summarizes a release record; this is a fleet record")
                    _write_summary(vsa, record, envelope, public, policy, signer, resource_uri, passed=True)
                typer.echo(summary(verified, path=str(record)), nl=False)
                if deep is not None:
                    for name, one in deep_records:
                        typer.echo(f"  {'deep' if name == deep_records[0][0] else '':<10} {name}: verified, verdict {one.verdict.value}, "
                                   f"{len(one.engines)} engine(s)")
                saw_record = True
            elif deep is not None or vsa is not None:
                flag = "--deep" if deep is not None else "--vsa"
                raise RecordError(f"{flag} needs a kvpreflight record; {record} is a {verified.predicate_type}")
            else:
                saw_summary = saw_summary or verified.predicate_type == VSA_PREDICATE_TYPE
            sys.stderr.write(f"OK: {record}\n")
        # An option that no file let us check is not a pass: say so.
        if (expect_model or expect_engine_version) and not saw_record and not refused:
            sys.stderr.write("FAIL: --expect-model and --expect-engine-version are checked in a kvpreflight record; pass the record too\n")
            refused = True
        if vsa is None and resource_uri and not saw_summary and not refused:
            sys.stderr.write("FAIL: --resource-uri is checked in a Verification Summary (or written into one with --vsa); none was given\n")
            refused = True
        if refused:
            raise typer.Exit(1)


def _write_summary(out: Path, record: Path, envelope: Envelope, public: PublicKey, policy: Policy, signer: SigningKey,
                   resource_uri: str, *, passed: bool) -> None:
    """The VSA of `record`; a record whose signature or type does not hold gets none (its subjects
    cannot be trusted), and FAIL says so."""
    from kvpreflight.record.attest import write_summary
    from kvpreflight.record.verify import authentic_subjects

    subjects = authentic_subjects(envelope, public)
    if subjects is None:
        sys.stderr.write(f"kvpreflight: no Verification Summary written: {record} is not a release record whose signature holds\n")
        return
    write_summary(out, record_path=record, subjects=subjects, policy=policy, passed=passed, resource_uri=resource_uri,
                  signer=signer, command_line=sys.argv)
    sys.stderr.write(f"kvpreflight: Verification Summary ({'PASSED' if passed else 'FAILED'}) written to {out}\n")
