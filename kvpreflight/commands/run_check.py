"""Turns parsed `check` arguments into a run: validate everything first (exit 2 before anything
is sent), run the pipeline, render the report, write the record. Shared by `check` and `demo`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from kvpreflight.commands import options as opt
from kvpreflight.errors import UsageError
from kvpreflight.model import Report


@dataclass(frozen=True)
class CheckRequest:
    endpoints: tuple[str, ...]
    entry: str | None = None
    engine: str = "auto"
    model: str | None = None
    context_length: int | None = None
    logs: tuple[str, ...] = ()
    api_key_env: str | None = None
    api_key_file: Path | None = None
    headers: tuple[str, ...] = ()
    ca_bundle: Path | None = None
    capacity_only: bool = False
    skips: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    fmt: str | None = None
    output: Path | None = None
    timeout: float = 30.0
    concurrency: int | None = None
    accepted_tps: float | None = None
    advisories: tuple[Path, ...] = ()
    record: Path | None = None
    sign_key: str | None = None
    subjects: tuple[str, ...] = ()
    unsigned: bool = False
    tenant_a_key_env: str | None = None
    tenant_b_key_env: str | None = None
    tenant_header: str | None = None
    allow_disruptive: bool = False
    # Filled by demo / boot mode, not by users:
    booted: bool = False
    log_paths: Mapping[str, Path] = field(default_factory=dict)
    known_markers: frozenset[str] = frozenset()
    extra_files_read: tuple[Path, ...] = ()
    gpus: tuple[Mapping, ...] = ()


def progress(message: str) -> None:
    sys.stderr.write(f"kvpreflight: {message}\n")
    sys.stderr.flush()


def prepare(request: CheckRequest):
    """Validate every argument; returns (CheckOptions, record plan). Raises UsageError (exit 2)."""
    from kvpreflight.checks import CHECK_IDS
    from kvpreflight.formats import FORMATS
    from kvpreflight.pipeline import CheckOptions, Target

    if not request.endpoints:
        raise UsageError("no --endpoint given; pass the URL of every prefill, decode or unified engine, or --boot SPEC.yaml")
    targets = []
    for text in request.endpoints:
        url, role = opt.parse_endpoint(text)
        if any(t.url == url for t in targets):
            raise UsageError(f"--endpoint {url} given twice")
        targets.append(Target(url, role))
    entry = opt.parse_url(request.entry, "--entry") if request.entry else None
    from kvpreflight.engines import ENGINES

    if request.engine != "auto" and request.engine not in ENGINES:
        raise UsageError(f"--engine {request.engine!r}: choose auto or one of {', '.join(ENGINES)}")
    if request.fmt is not None and request.fmt not in FORMATS:
        raise UsageError(f"--format {request.fmt!r}: choose one of {', '.join(FORMATS)}")
    opt.positive(request.context_length, "--context-length")
    opt.positive(request.timeout, "--timeout")
    opt.positive(request.concurrency, "--concurrency")
    opt.positive(request.accepted_tps, "--accepted-tokens-per-second")
    if request.ca_bundle is not None and not request.ca_bundle.is_file():
        raise UsageError(f"--ca-bundle {request.ca_bundle}: no such file")
    for folder in request.advisories:
        if not folder.is_dir():
            raise UsageError(f"--advisories {folder}: not a folder")
    logs = {**opt.parse_logs(request.logs, [t.url for t in targets]), **request.log_paths}
    headers = opt.parse_headers(request.headers)
    key = opt.api_key(request.api_key_env, request.api_key_file)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    waivers = opt.parse_waivers(request.skips, request.reasons, CHECK_IDS)
    tenant_headers, tenant_binding = opt.tenant_headers(request.tenant_a_key_env, request.tenant_b_key_env, request.tenant_header)

    signer = subjects = None
    if request.record is not None:
        from kvpreflight.record import parse_subjects, prepare_signer

        signer = prepare_signer(request.sign_key, unsigned=request.unsigned)
        subjects = parse_subjects(request.subjects)
    elif request.sign_key or request.subjects or request.unsigned:
        raise UsageError("--sign-key, --subject and --unsigned only make sense with --record FILE")

    options = CheckOptions(
        targets=tuple(targets), entry=entry, engine=request.engine, model=request.model,
        context_length=request.context_length, logs=logs, headers=headers,
        ca_bundle=str(request.ca_bundle) if request.ca_bundle else None, capacity_only=request.capacity_only,
        waivers=waivers, timeout_s=request.timeout, concurrency=request.concurrency,
        accepted_tokens_per_second=request.accepted_tps, advisory_dirs=request.advisories,
        known_markers=request.known_markers, gpus=request.gpus,
        tenant_headers=tenant_headers, tenant_binding=tenant_binding,
        allow_disruptive=request.allow_disruptive, booted=request.booted,
    )
    return options, (signer, subjects)


def execute(request: CheckRequest, *, on_report: Callable[[Report], None] | None = None) -> int:
    options, (signer, subjects) = prepare(request)
    from kvpreflight.formats import write_report
    from kvpreflight.formats.ci import github_actions_side_effects
    from kvpreflight.pipeline import run_check

    report = run_check(options, progress)
    if on_report:
        on_report(report)
    fmt = request.fmt or "table"
    write_report(report, fmt, request.output)
    github_actions_side_effects(report, format_name=fmt if request.output is None else None)
    if request.record is not None:
        from kvpreflight.record import emit_record

        files = [*options.logs.values(), *request.extra_files_read]
        path = emit_record(report, path=request.record, signer=signer, command_line=list(sys.argv),
                           subjects=list(subjects or []), files_read=files)
        progress(f"record written to {path} ({'signed' if signer else 'UNSIGNED'})")
    return report.exit_code


def execute_booted(spec, request: CheckRequest, *, log_dir: Path, before_check: Callable | None = None,
                   on_report: Callable[[Report], None] | None = None) -> int:
    """Boot every engine of `spec`, hand the same targets attach mode has to `execute`, stop all.

    The spec's context length, waivers and file join the request; the logs kvpreflight captured
    become an independent capacity source. `before_check(deployment)` runs once all are ready.
    """
    from dataclasses import replace

    from kvpreflight.boot import boot_deployment

    # Validate every argument before minutes of engine start-up (exit 2 first); the endpoint is
    # a stand-in for the URLs the boot will give.
    prepare(replace(request, endpoints=("http://127.0.0.1:1",)))
    with boot_deployment(spec, log_dir) as deployment:
        if before_check is not None:
            before_check(deployment)
        skips = tuple(w.check_id for w in spec.checks.skip) + request.skips
        reasons = tuple(w.reason for w in spec.checks.skip) + request.reasons
        engines = {e.engine for e in deployment.workers}
        booted = replace(
            request,
            endpoints=deployment.endpoint_args(),
            entry=deployment.entry_url,
            engine=request.engine if request.engine != "auto" or len(engines) != 1 or "auto" in engines else engines.pop(),
            context_length=request.context_length or spec.context_length,
            skips=skips, reasons=reasons,
            log_paths={e.url.rstrip("/"): Path(e.log_path) for e in deployment.workers},
            extra_files_read=request.extra_files_read + ((Path(spec.source),) if Path(spec.source).is_file() else ()),
            gpus=deployment.gpu_records(),
            booted=True,
        )
        return execute(booted, on_report=on_report)
