"""`kvpreflight fleet`, wired: validate everything (exit 2 before anything runs), run every
deployment through a runner, print the merged report, write the records, exit with the verdict."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvpreflight._internal.clock import utc_now
from kvpreflight._internal.files import check_writable
from kvpreflight._internal.redact import Redactor, redact, secrets_of
from kvpreflight.errors import ConfigError
from kvpreflight.fleet.errors import FleetError
from kvpreflight.fleet.job import JobSettings, Outcome
from kvpreflight.fleet.runners.interface import Batch, Events, Runner, describe, plan_batches
from kvpreflight.model import Status

if TYPE_CHECKING:
    from kvpreflight.fleet.inventory import Inventory
    from kvpreflight.fleet.report import FleetReport

DEFAULT_LOCAL_PARALLEL = 4


@dataclass(frozen=True)
class FleetRequest:
    inventory: Path
    parallel: int | None = None
    ray: str | None = None  # None: this machine; "auto" or an address: Ray
    fmt: str | None = None
    output: Path | None = None
    record: Path | None = None
    sign_key: str | None = None
    allow_insecure_key: bool = False  # sign with a key others can read
    subjects: tuple[str, ...] = ()
    unsigned: bool = False
    work_dir: Path | None = None  # kept afterwards; None: a temporary folder, removed unless keep
    keep: bool = False
    command_line: tuple[str, ...] = ("kvpreflight", "fleet")  # for the records (secrets redacted there)


def say(message: str) -> None:
    sys.stderr.write(f"kvpreflight fleet: {message}\n")
    sys.stderr.flush()


class FleetProgress(Events):
    """Done / running / left on stderr, and each result as it comes (with no secret in it)."""

    def __init__(self, total: int, secrets: Iterable[str] = ()) -> None:
        self.total = total
        self.done = 0
        self.running = 0
        self.redactor = Redactor(secrets)

    def _counts(self) -> str:
        return f"[{self.done}/{self.total} done, {self.running} running, {self.total - self.done - self.running} left]"

    def started(self, batch: Batch, where: str) -> None:
        self.running += len(batch)
        say(f"started {describe(batch)} on {where} {self._counts()}")

    def finished(self, outcome: Outcome) -> None:
        from kvpreflight.fleet.report import problems

        self.done += 1
        self.running = max(0, self.running - 1)
        detail = "" if outcome.verdict is Status.PASS else f": {problems(outcome)}"
        say(self.redactor.text(f"{outcome.deployment} {outcome.verdict.value.upper()}{detail} {self._counts()}"))


def _runner(request: FleetRequest, inventory: Inventory) -> Runner:
    if request.parallel is not None and request.parallel < 1:
        raise FleetError(f"--parallel must be 1 or more (got {request.parallel})")
    if request.ray is not None:
        from kvpreflight.fleet.runners.ray import RayRunner, import_ray

        import_ray()
        return RayRunner(request.ray, request.parallel)
    pinned = [d for d in inventory.deployments if d.kind != "attach" and d.placement.pinned]
    if pinned:
        d = pinned[0]
        raise FleetError(f"deployment {d.name} boots on node {d.placement.describe()}: that needs --ray auto|ADDRESS "
                         "(without --ray every deployment is checked from this machine)")
    from kvpreflight.fleet.runners.local import LocalRunner

    return LocalRunner(request.parallel or DEFAULT_LOCAL_PARALLEL)


def execute(request: FleetRequest) -> int:
    """Run `kvpreflight fleet`: check every deployment of the inventory, write the report and records; the exit code."""
    from kvpreflight import __version__
    from kvpreflight.fleet.inventory import load_inventory
    from kvpreflight.fleet.records import check_record_path, write_fleet_records
    from kvpreflight.fleet.render import FLEET_FORMATS
    from kvpreflight.fleet.report import FleetReport, merged_report
    from kvpreflight.formats import FORMATS
    from kvpreflight.record import file_subject, parse_subjects, prepare_signer
    from kvpreflight.targets import refuse_expired_waivers

    inventory = load_inventory(request.inventory)
    for d in inventory.deployments:  # each would make a record `verify` refuses: refuse the fleet now
        try:
            refuse_expired_waivers(d.waivers)
        except ConfigError as exc:
            raise FleetError(f"{inventory.source}: deployment {d.name}: {exc}") from None
    fmt = request.fmt or "table"
    if fmt not in FORMATS and fmt not in FLEET_FORMATS:
        raise FleetError(f"--format {fmt!r}: choose one of {', '.join(dict.fromkeys([*FLEET_FORMATS, *FORMATS]))}")
    if request.output is not None:
        check_writable(request.output, "--output", FleetError)
    signer = None
    if request.record is not None:
        signer = prepare_signer(request.sign_key, unsigned=request.unsigned, allow_insecure_key=request.allow_insecure_key)
        check_record_path(request.record, [d.name for d in inventory.deployments])
    elif request.sign_key or request.unsigned:
        raise FleetError("--sign-key and --unsigned only make sense with --record FILE")
    subjects = [file_subject(request.inventory), *parse_subjects(inventory.subjects), *parse_subjects(request.subjects)]
    batches = plan_batches(inventory.deployments)
    runner = _runner(request, inventory)
    boots = any(d.kind != "attach" for d in inventory.deployments)
    # Boot logs go to --work-dir (kept), else to a temporary folder (this machine's, or one per
    # deployment on its Ray node) removed once the report and the records are written, unless --keep.
    work_dir = temporary = None
    if request.work_dir is not None:
        work_dir = request.work_dir
    elif boots and runner.name == "local":
        work_dir = temporary = Path(tempfile.mkdtemp(prefix=f"kvpreflight-fleet-{inventory.name}-"))
    settings = JobSettings(command_line=request.command_line, subjects=tuple(str(s) for s in subjects),
                           work_dir=str(work_dir.resolve()) if work_dir else None,
                           keep=request.keep or request.work_dir is not None)
    shared = sum(1 for b in batches if len(b) > 1)
    where = ""
    if work_dir is not None and boots:
        where = f"; boot logs under {work_dir}" + ("" if settings.keep else " (removed afterwards unless --keep)")
    say(f"{len(inventory.deployments)} deployment(s) from {request.inventory}, runner {runner.name}"
        + (f", {shared} group(s) share an engine and run one after another" if shared else "") + where)
    secrets = _secrets(inventory)
    started = utc_now()
    try:
        outcomes = runner.run(batches, settings, FleetProgress(len(inventory.deployments), secrets))
        report = FleetReport(name=inventory.name, runner=runner.name, outcomes=tuple(outcomes), inventory=str(request.inventory),
                             started_at=started, finished_at=utc_now(), tool_version=__version__)
        records: dict[str, str] = {}
        if request.record is not None:
            records = write_fleet_records(report, record=request.record, signer=signer, subjects=subjects,
                                          command_line=list(request.command_line), secrets=secrets)
            say(f"fleet record written to {request.record} ({'signed' if signer else 'UNSIGNED'}), "
                f"{len(records)} deployment record(s) beside it")
        _write(report, fmt, request.output, records, secrets)
    finally:
        if temporary is not None and request.keep:
            say(f"boot logs kept in {temporary}")
        elif temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    from kvpreflight.formats.ci import github_actions_side_effects

    github_actions_side_effects(merged_report(report), format_name=fmt if request.output is None else None)
    return report.exit_code


def _secrets(inventory: Inventory) -> frozenset[str]:
    """The API keys this machine holds for the attached deployments (their values never reach a
    report or record; a node that checks one reads its own copy)."""
    from kvpreflight.fleet.inventory import AttachTarget

    return secrets_of(values=[s for d in inventory.deployments if isinstance(d.target, AttachTarget)
                              for s in d.target.secrets_here()])


def _write(report: FleetReport, fmt: str, output: Path | None, records: dict[str, str], secrets: Iterable[str]) -> None:
    from kvpreflight.fleet.render import render
    from kvpreflight.formats import write_text

    write_text(redact(render(report, fmt, records), secrets), output)
