"""Per-deployment records and the one fleet record that names them by digest.

Each deployment's statement was built where it ran; here, on the driver, it is signed (the key
never leaves this machine) and written as `<deployment>.dsse.json` beside the fleet record. A
deployment that was not measured still gets a record: verdict inconclusive, with the reason. The
fleet record's subjects are `record:<file name>` with each record file's SHA-256, plus the
fleet's own subjects (the inventory file, --subject); `kvpreflight verify --deep DIR` checks both.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvpreflight._internal.clock import utc_now
from kvpreflight._internal.files import FileKind, check_writable, sha256_of
from kvpreflight.fleet.errors import FleetError
from kvpreflight.fleet.job import Outcome
from kvpreflight.fleet.report import FLEET_CHECK_ID, FleetReport, deployment_summary
from kvpreflight.model import CheckResult, Report, Status
from kvpreflight.record import (
    FleetPredicate,
    SigningKey,
    Subject,
    build_statement,
    sign_statement,
    statement,
    unsigned_envelope,
    write_record,
)
from kvpreflight.record.verify import RECORD_SUBJECT_PREFIX

RECORD_SUFFIX = ".dsse.json"


def record_name(deployment: str) -> str:
    return f"{deployment}{RECORD_SUFFIX}"


def check_record_path(record: Path, deployments: Sequence[str]) -> None:
    """Before anything runs: the fleet record must not take a deployment record's place, and it
    and the deployments' records beside it can be written."""
    if record.name in {record_name(d) for d in deployments}:
        raise FleetError(f"--record {record}: that file name is a deployment's record ({record.name}); "
                         f"choose another, e.g. fleet{RECORD_SUFFIX}")
    check_writable(record, "--record", FleetError)


def _not_measured_statement(outcome: Outcome, report: FleetReport, subjects: list[Subject], command_line: list[str],
                            secrets: Iterable[str]) -> dict[str, Any]:
    stand_in = Report(
        tool_version=report.tool_version, engines=(),
        checks=(CheckResult(id=FLEET_CHECK_ID, status=Status.INCONCLUSIVE, message=f"not measured: {outcome.reason}",
                            endpoint=outcome.deployment, evidence={"host": outcome.host, "node": outcome.node}),),
        started_at=report.started_at, finished_at=report.finished_at,
    )
    return build_statement(stand_in, command_line=[*command_line, f"[deployment {outcome.deployment}]"], subjects=subjects,
                           secrets=secrets)


def _envelope(body: Mapping[str, Any], signer: SigningKey | None) -> dict[str, Any]:
    return sign_statement(dict(body), signer) if signer is not None else unsigned_envelope(dict(body))


def write_fleet_records(report: FleetReport, *, record: Path, signer: SigningKey | None, subjects: list[Subject],
                        command_line: list[str], secrets: Iterable[str] = ()) -> dict[str, str]:
    """Write every deployment's record and the fleet record; returns deployment -> record path."""
    secrets = tuple(secrets)
    folder = record.parent if str(record.parent) else Path(".")
    written: dict[str, str] = {}
    record_subjects: list[Subject] = []
    for outcome in report.outcomes:
        body = outcome.statement or _not_measured_statement(outcome, report, subjects, command_line, secrets)
        path = write_record(folder / record_name(outcome.deployment), _envelope(body, signer))
        written[outcome.deployment] = str(path)
        record_subjects.append(Subject(f"{RECORD_SUBJECT_PREFIX}{path.name}", sha256_of(path, FileKind.RECORD, FleetError)))
    fleet = fleet_statement(report, subjects=[*subjects, *record_subjects], command_line=command_line,
                            records={k: os.path.basename(v) for k, v in written.items()}, secrets=secrets)
    write_record(record, _envelope(fleet, signer))
    return written


def fleet_statement(report: FleetReport, *, subjects: list[Subject], command_line: list[str],
                    records: dict[str, str], secrets: Iterable[str] = ()) -> dict[str, Any]:
    predicate = FleetPredicate(
        fleet=report.name, runner=report.runner, tool_version=report.tool_version, started_at=report.started_at,
        finished_at=report.finished_at, verdict=report.verdict, counts=report.counts(),
        deployments=tuple(deployment_summary(o, records.get(o.deployment)) for o in report.outcomes),
        time=utc_now(), host=socket.gethostname(),
    )
    return statement(predicate, subjects=subjects, command_line=command_line, secrets=secrets)
