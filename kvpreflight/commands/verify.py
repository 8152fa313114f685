"""`kvpreflight verify`: the release gate for a signed record. Never imports torch or an engine."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify(
        record: Path = typer.Argument(..., help="The record file (DSSE envelope) written by `kvpreflight check --record`."),
        key: Path = typer.Option(..., "--key", help="The signer's public key (kvpreflight.pub)."),
        subject: list[str] | None = typer.Option(None, "--subject", help="NAME=sha256:HEX that must be in the record with exactly this digest. Repeatable."),
        max_age: str = typer.Option("24h", "--max-age", help="Refuse a record older than this (s, m, h, d)."),
        allow_fail: bool = typer.Option(False, "--allow-fail", help="Check authenticity, subjects and age only; accept any verdict."),
        require_pass: bool = typer.Option(False, "--require-pass", help="Require the verdict pass (the default; for explicit pipelines)."),
        any_subject: bool = typer.Option(False, "--any-subject", help="Accept a record without naming a --subject."),
        require: list[str] | None = typer.Option(None, "--require", help="A check id that must have run and decided (not skip, waived or inconclusive). Repeatable; default kv-capacity, overcapacity-rejected, tenant-isolation; 'none' requires nothing."),
        expect_model: str | None = typer.Option(None, "--expect-model", help="Refuse the record unless every engine in it reported serving this model."),
        expect_engine_version: str | None = typer.Option(None, "--expect-engine-version", help="Refuse the record unless every engine in it reported this version."),
        deep: Path | None = typer.Option(None, "--deep", help="RECORD is a fleet record: also verify every deployment record it names, found in this folder, by digest, key and the same policy."),
    ) -> None:
        """Exit 0 only if RECORD is signed by --key, names every --subject with its digest, is younger than --max-age and passed.

        Exit 1: refused (the reason names the condition). Exit 2: bad input (missing or malformed file or key, bad option).
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
            verify_envelope,
        )

        if allow_fail and require_pass:
            raise RecordError("--allow-fail and --require-pass contradict each other; pass one")
        policy = Policy(
            subjects=tuple(parse_subjects(subject)),
            any_subject=any_subject,
            max_age=parse_duration(max_age),
            allow_fail=allow_fail,
            required=parse_required(require),
            expect_model=expect_model,
            expect_engine_version=expect_engine_version,
        )
        public = load_public_key(key)
        envelope = read_record(record)
        verified = verify_envelope(envelope, public, policy)
        if deep is not None:
            from kvpreflight.record.verify import verify_deep

            deep_records = verify_deep(verified, deep, public, policy)
        typer.echo(summary(verified, path=str(record)), nl=False)
        if deep is not None:
            for name, one in deep_records:
                typer.echo(f"  {'deep' if name == deep_records[0][0] else '':<10} {name}: verified, verdict {one.verdict.value}, "
                           f"{len(one.predicate.get('engines') or [])} engine(s)")
