"""kvpreflight's library entry points: plan -> run -> Report -> outputs.

`check` (the CLI command), `demo` and the fleet all come here; none of them goes through the CLI.

    from kvpreflight import preflight
    from kvpreflight.check_plan import CheckPlan, OutputPlan
    from kvpreflight.targets import parse_endpoints

    plan = CheckPlan(targets=parse_endpoints(["prefill=http://p:30000", "decode=http://d:30001"]),
                     entry="http://router:8000")
    report = preflight.run(plan)                      # attached engines
    report, files = preflight.run_booted(spec, plan, log_dir=Path("logs"))   # boot, check, stop
    preflight.publish(report, OutputPlan(format="json"), files_read=files)

Configuration problems are found before anything is contacted or booted: `CheckPlan`,
`RecordPlan` and boot specs are validated when they are built (`prepare_record` here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kvpreflight.check_plan import CheckPlan, OutputPlan, RecordPlan
from kvpreflight.errors import ConfigError
from kvpreflight.model import ProcessRole, Report
from kvpreflight.targets import Target

__all__ = ["BootedRun", "LaunchedEngine", "booted_plan", "launched_plan", "prepare_record", "preview", "publish", "run", "run_booted",
           "running_plan", "validate", "verify_command"]

if TYPE_CHECKING:
    from kvpreflight._internal.request_plan import GroupPreview
    from kvpreflight.boot.deployment import BootedDeployment
    from kvpreflight.boot.spec import DeploymentSpec

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def validate(plan: CheckPlan) -> None:
    """Load the check data the plan will use (thresholds, advisory folders): a malformed file is a
    configuration error now, not after engines were booted or probed."""
    from kvpreflight._internal.checkdata import load_thresholds
    from kvpreflight._internal.checks.advisory_data import load_advisories
    from kvpreflight.targets import refuse_expired_waivers

    refuse_expired_waivers(plan.waivers)
    load_thresholds()
    load_advisories(plan.advisory_dirs)


def run(plan: CheckPlan, progress: Progress = _quiet) -> Report:
    """Read every engine of the plan, probe through its entry, judge: the Report."""
    from kvpreflight._internal.pipeline import run_check

    return run_check(plan, progress)


def preview(plan: CheckPlan, *, measure: bool = True, progress: Progress = _quiet) -> list[GroupPreview]:
    """`check --plan`: what `run(plan)` would send and how long it should take; sends nothing but
    one calibration request per entry (none without `measure`). A plan above the plan's
    `max_context_equivalents` raises PlanTooCostly (exit 2) before anything is sent."""
    from kvpreflight._internal.pipeline import preview as preview_groups

    validate(plan)
    return preview_groups(plan, measure=measure, progress=progress)


@dataclass(frozen=True)
class BootedRun:
    report: Report
    files_read: tuple[Path, ...]  # the spec and every captured engine log: subjects of the record


def run_booted(spec: DeploymentSpec, plan: CheckPlan, *, log_dir: Path,
               before_check: Callable[[BootedDeployment], None] | None = None,
               progress: Progress = _quiet) -> BootedRun:
    """Boot every engine of `spec`, check them with `plan` (its targets are ignored: the booted
    engines are the targets), stop everything, whatever happens.

    The spec's context length, waivers and client certificate join the plan; the logs kvpreflight
    captured become an independent capacity source. `before_check(deployment)` runs once all
    engines are ready.
    """
    from kvpreflight.boot import boot_deployment

    validate(replace(plan, waivers=(*spec.checks.skip, *plan.waivers)))
    if spec.client_cert is not None and plan.auth.client_cert is not None:
        raise ConfigError(f"{spec.source}: sets client_cert, and --client-cert is given too; keep one")
    spec.check_client_certificate()
    # The boot's steps go through the caller's progress too (on a terminal: its live line).
    say = None if progress is _quiet else progress
    with boot_deployment(spec, log_dir, secrets=plan.auth.secrets, say=say) as deployment:
        if before_check is not None:
            before_check(deployment)
        booted = booted_plan(plan, spec, deployment)
        report = run(booted, progress)
    spec_file = (Path(spec.source),) if Path(spec.source).is_file() else ()
    return BootedRun(report, (*spec_file, *booted.logs.values()))


def booted_plan(plan: CheckPlan, spec: DeploymentSpec, deployment: BootedDeployment) -> CheckPlan:
    """The plan for a booted deployment: its engines, entry, logs, GPUs, the spec's waivers and
    client certificate."""
    workers = deployment.workers
    return replace(
        launched_plan(plan, spec, workers, deployment.entry_url),
        waivers=(*spec.checks.skip, *plan.waivers),
        # The router's log too: its danger lines tie to the probes (kvpreflight._internal.probes.logs).
        logs={e.url.rstrip("/"): Path(e.log_path) for e in deployment.engines
              if e in workers or e.url.rstrip("/") == deployment.entry_url.rstrip("/")},
        gpus=deployment.gpu_records(),
        listeners=deployment.listeners(),
        booted=True,
    )


def running_plan(plan: CheckPlan, spec: DeploymentSpec) -> CheckPlan:
    """The plan for a spec's engines running now where its port numbers and urls put them
    (started elsewhere; nothing is booted): `watch --spec`. ConfigError naming an engine whose
    port the spec leaves to boot time."""
    from kvpreflight.boot.errors import BootConfigError
    from kvpreflight.boot.launch import running_plan as launch_plan

    if spec.client_cert is not None and plan.auth.client_cert is not None:
        raise ConfigError(f"--spec {spec.source} sets client_cert, and --client-cert is given too; keep one")
    try:
        launch = launch_plan(spec)
    except BootConfigError as exc:
        raise ConfigError(f"--spec {exc}") from None
    return launched_plan(plan, spec, [e for e in launch.engines if e.role is not ProcessRole.ROUTER], launch.entry_url)


class LaunchedEngine(Protocol):
    """One engine a spec launched (kvpreflight.boot's BootedEngine, or its LaunchPlan)."""

    @property
    def url(self) -> str: ...
    @property
    def role(self) -> ProcessRole: ...
    @property
    def engine(self) -> str: ...


def launched_plan(plan: CheckPlan, spec: DeploymentSpec, workers: Sequence[LaunchedEngine], entry_url: str) -> CheckPlan:
    """`plan` pointed at the engines a spec launched: their URLs and roles, the entry, the engines'
    one kind (`session.one_kind`), the spec's context length (unless the plan promises one) and
    client certificate. The one way from a spec's launch to a plan (boot mode and `watch --spec`)."""
    from kvpreflight._internal.redact import secrets_of
    from kvpreflight._internal.session import one_kind

    targets = tuple(Target(e.url.rstrip("/"), ProcessRole(e.role).engine_role) for e in workers)
    auth = plan.auth if spec.client_cert is None else replace(plan.auth, client_cert=spec.client_cert, client_key=spec.client_key)
    return replace(
        plan,
        targets=targets,
        entry=entry_url.rstrip("/"),
        engine=one_kind(plan.engine, [e.engine for e in workers]),
        context_length=plan.context_length or spec.context_length,
        auth=replace(auth, secrets=auth.secrets | secrets_of(urls=[*(t.url for t in targets), entry_url])),
    )


def prepare_record(path: Path, *, sign_key: str | None, subjects: Sequence[str], unsigned: bool,
                   command_line: Sequence[str], reads_files: bool, test_result: Path | None = None,
                   advisory_dirs: Sequence[Path] = (), spec: Path | None = None,
                   allow_insecure_key: bool = False) -> RecordPlan:
    """Everything a record needs, checked before any engine is contacted: the key loads, every
    subject parses, and the record will have at least one subject (`reads_files`: the run reads a
    log or spec file, whose digest becomes a subject). With `test_result`, the Test Result's
    configuration: kvpreflight's thresholds and advisories, `advisory_dirs`' files and `spec`."""
    from kvpreflight.record import parse_subjects, prepare_signer, resolve_sign_key_path

    signer = prepare_signer(sign_key, unsigned=unsigned, allow_insecure_key=allow_insecure_key)
    key_path = resolve_sign_key_path(sign_key) if signer is not None else None
    public_key = key_path.with_suffix(".pub") if key_path is not None else None
    parsed = tuple(parse_subjects(subjects))
    if not parsed and not reads_files:
        raise ConfigError("a record needs at least one subject: pass --subject NAME=sha256:HEX "
                          "(the image, config or model revision it is about)")
    configuration: tuple[tuple[str, Path], ...] = ()
    if test_result is not None:
        from kvpreflight.record.attest import configuration_files

        if Path(test_result) == Path(path):
            raise ConfigError(f"--test-result {test_result} is the --record file; give the Test Result its own file")
        configuration = configuration_files(advisory_dirs, spec)
    return RecordPlan(path=path, signer=signer, subjects=parsed, command_line=tuple(command_line),
                      test_result=test_result, configuration=configuration,
                      public_key=public_key if public_key is not None and public_key.is_file() else None)


def verify_command(record: RecordPlan, path: Path, report: Report) -> str:
    """The `kvpreflight verify` command that checks the record just written, as a user would type it."""
    subjects = " ".join(f"--subject {s}" for s in record.subjects) or "--any-subject"
    key = record.public_key or "PUBLIC_KEY.pub"
    return f"kvpreflight verify {path} --key {key} {subjects}" + (" --allow-fail" if report.exit_code != 0 else "")


def publish(report: Report, output: OutputPlan, *, files_read: Iterable[Path] = (), secrets: Iterable[str] = (),
            progress: Progress = _quiet) -> Path | None:
    """Render the report (stdout or a file), GitHub Actions annotations, and the record if planned,
    each with every value of `secrets` (the plan's `auth.secrets`) removed. Returns the record's path."""
    from kvpreflight._internal.redact import redact_report

    secrets = frozenset(secrets)
    report = redact_report(replace(report, name=output.name, spec=None if output.spec is None else str(output.spec)), secrets)
    from kvpreflight.formats import get_format, write_report
    from kvpreflight.formats.ci import github_actions_side_effects
    from kvpreflight.formats.table import TableFormat

    formatter = get_format(output.format)
    if output.quiet:
        formatter = TableFormat(quiet=True)  # build_output allows quiet with the table only
    write_report(report, formatter, output.path)  # already redacted above (URL credentials too)
    github_actions_side_effects(report, format_name=output.format if output.path is None else None)
    if output.record is None:
        return None
    from kvpreflight.record import emit_record

    record = output.record
    path = emit_record(report, path=record.path, signer=record.signer, command_line=list(record.command_line),
                       subjects=list(record.subjects), files_read=list(files_read), secrets=secrets,
                       test_result=record.test_result, configuration=record.configuration)
    signed = "signed" if record.signer else "UNSIGNED"
    if record.test_result is not None:
        progress(f"in-toto Test Result written to {record.test_result} ({signed})")
    progress(f"record written to {path} ({signed})")
    if record.signer:
        progress(f"verify the record: {verify_command(record, path, report)}")
    return path
