"""`verify`'s options as a user gives them (`VerifyOptions`, unparsed) and every rule between them:
`check_verify_fields` (no file read) and `build_verify_plan` (then the keys are loaded and the
values parsed into a `Policy`). The CLI only parses flags into `VerifyOptions`; a library user
builds the same options and gets the same one-line errors (`RecordError`, exit 2), each naming
the flag."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpreflight.record.errors import RecordError
from kvpreflight.record.keys import PublicKey, SigningKey
from kvpreflight.record.verify import DEFAULT_MAX_AGE, Policy

__all__ = ["SummaryPlan", "VerifyOptions", "VerifyPlan", "build_verify_plan", "check_verify_fields", "verify_options_from"]


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    """`kvpreflight verify`'s options, named as its parameters; files and keys are only named here."""

    records: tuple[Path, ...]
    key: Path  # the signer's public key
    subjects: tuple[str, ...] = ()  # NAME=sha256:HEX every record must name
    any_subject: bool = False
    max_age: str | None = None  # None: DEFAULT_MAX_AGE
    allow_fail: bool = False
    require_pass: bool = False  # the default, said explicitly
    required: tuple[str, ...] = ()  # --require values; none given: the default checks
    expect_model: str | None = None
    expect_engine_version: str | None = None
    deep: Path | None = None  # the folder holding a fleet record's deployment records
    allow_warned: bool = False
    vsa: Path | None = None  # where to write a Verification Summary of the one record
    resource_uri: str | None = None  # with vsa: written into it; without: what a summary must be about
    sign_key: str | None = None  # with vsa (else $KVPREFLIGHT_SIGN_KEY)
    allow_insecure_key: bool = False
    command_line: tuple[str, ...] = ()  # written into a Verification Summary


def verify_options_from(values: Mapping[str, Any], **fixed: Any) -> VerifyOptions:
    """VerifyOptions from a command's parameters named as its fields (a repeatable option typer
    leaves None is the empty tuple), plus `fixed` values the command decides itself."""
    given = {f.name: tuple(value or ()) if isinstance(value, list) or (value is None and f.default == ()) else value
             for f in dataclasses.fields(VerifyOptions) if f.name in values for value in (values[f.name],)}
    return VerifyOptions(**{**given, **fixed})


@dataclass(frozen=True)
class SummaryPlan:
    """`--vsa`: the Verification Summary to write, about what, signed by whom."""

    path: Path
    resource_uri: str
    signer: SigningKey
    command_line: tuple[str, ...]


@dataclass(frozen=True)
class VerifyPlan:
    """Everything `verify_files` needs, validated and loaded."""

    records: tuple[Path, ...]
    key: PublicKey
    policy: Policy
    deep: Path | None = None
    summary: SummaryPlan | None = None
    # --expect-model/--expect-engine-version: only a kvpreflight record shows the engines.
    needs_record: bool = False
    # --resource-uri without --vsa: only a Verification Summary names its resource.
    needs_summary: bool = False


def check_verify_fields(options: VerifyOptions) -> None:
    """Every rule between the options that needs no file; RecordError (exit 2) naming the flags."""
    if options.allow_fail and options.require_pass:
        raise RecordError("--allow-fail and --require-pass contradict each other; pass one")
    if options.vsa is not None:
        if len(options.records) != 1 or options.deep is not None:
            raise RecordError("--vsa summarizes one release record; pass one RECORD and no --deep")
        if options.allow_fail:
            raise RecordError("--vsa says whether RECORD passed verify's policy; drop --allow-fail")
        if not options.resource_uri:
            raise RecordError("--vsa needs --resource-uri URI: the image or deployment the summary is about")
    elif options.sign_key:
        raise RecordError("--sign-key only makes sense with --vsa FILE")


def build_verify_plan(options: VerifyOptions) -> VerifyPlan:
    """`check_verify_fields`, then the summary's path checked and its signing key loaded, the policy's
    values parsed and the public key loaded: every input error before any record is read."""
    from kvpreflight.record.keys import load_public_key
    from kvpreflight.record.release import parse_subjects
    from kvpreflight.record.verify import parse_duration, parse_required

    check_verify_fields(options)
    summary = None
    if options.vsa is not None:
        summary = _summary_plan(options)
    policy = Policy(
        subjects=tuple(parse_subjects(options.subjects)),
        any_subject=options.any_subject,
        max_age=parse_duration(options.max_age or DEFAULT_MAX_AGE),
        allow_fail=options.allow_fail,
        required=parse_required(list(options.required)),
        expect_model=options.expect_model,
        expect_engine_version=options.expect_engine_version,
        allow_warned=options.allow_warned,
        # With --vsa the URI is what the summary is written about, not a condition on RECORD.
        resource_uri=None if options.vsa is not None else options.resource_uri,
    )
    return VerifyPlan(records=options.records, key=load_public_key(options.key), policy=policy, deep=options.deep, summary=summary,
                      needs_record=bool(options.expect_model or options.expect_engine_version),
                      needs_summary=options.vsa is None and bool(options.resource_uri))


def _summary_plan(options: VerifyOptions) -> SummaryPlan:
    from kvpreflight._internal.files import check_writable
    from kvpreflight.record.keys import load_signing_key, resolve_sign_key_path

    assert options.vsa is not None and options.resource_uri  # check_verify_fields holds --vsa to these
    check_writable(options.vsa, "--vsa", RecordError)
    path = resolve_sign_key_path(options.sign_key)
    if path is None:
        raise RecordError("--vsa needs --sign-key PATH (or KVPREFLIGHT_SIGN_KEY=PATH): the summary is signed")
    signer = load_signing_key(path, allow_insecure=options.allow_insecure_key)
    return SummaryPlan(path=options.vsa, resource_uri=options.resource_uri, signer=signer, command_line=options.command_line)
