"""`kvpreflight verify`: the release gate for signed records, in-toto Test Results and SLSA
Verification Summaries. Never imports torch or an engine."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kvpreflight._internal.commands import options


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify(
        records: list[Path] = typer.Argument(..., metavar="RECORD",
            help="Files to verify: records written by `check --record` (or `fleet --record`), Test Results (`check --test-result`), "
                 "Verification Summaries (`verify --vsa`)."),
        key: Path = typer.Option(..., "--key", help="The signer's public key (kvpreflight.pub)."),
        # A subject the record must name, not one written into it as check's --subject is.
        subjects: list[str] | None = typer.Option(None, "--subject",
            help="NAME=sha256:HEX that must be in the record with exactly this digest. Repeatable."),
        # The default is the library's (record.verify.DEFAULT_MAX_AGE), shown in the help only.
        max_age: str | None = typer.Option(None, "--max-age",
            help="Refuse a record or Verification Summary older than this (s, m, h, d); a Test Result carries no time: verify it with "
                 "its record. \\[default: 24h]"),
        allow_fail: bool = typer.Option(False, "--allow-fail", help="Check authenticity, subjects and age only; accept any verdict."),
        require_pass: bool = typer.Option(False, "--require-pass", help="Require the verdict pass (the default; for explicit pipelines)."),
        any_subject: bool = typer.Option(False, "--any-subject", help="Accept a record without naming a --subject."),
        required: list[str] | None = typer.Option(None, "--require",
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
        from kvpreflight.record.gate import verify_files
        from kvpreflight.record.verify_options import build_verify_plan, verify_options_from

        # The parameters are VerifyOptions' fields; every rule between them is build_verify_plan's.
        plan = build_verify_plan(verify_options_from(locals(), command_line=tuple(sys.argv)))
        raise typer.Exit(verify_files(plan, out=sys.stdout.write, err=sys.stderr.write))
