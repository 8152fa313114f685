"""Per-deployment records and the one fleet record that names them by digest.

Each deployment's statement was built where it ran; here, on the driver, it is signed (the key
never leaves this machine) and written as `<deployment>.dsse.json` beside the fleet record. A
deployment that was not measured still gets a record: verdict inconclusive, with the reason. The
fleet record's subjects are `record:<file name>` with each record file's SHA-256, plus the
fleet's own subjects (the inventory file, --subject); `kvpreflight verify --deep DIR` checks both.
"""

from __future__ import annotations

import hashlib
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from kvpreflight.fleet.errors import FleetError
from kvpreflight.fleet.job import Outcome
from kvpreflight.fleet.report import FLEET_CHECK_ID, FleetReport, fleet_to_dict
from kvpreflight.record import Subject, SigningKey, build_statement, sign_statement, unsigned_envelope, write_record
from kvpreflight.record.statement import STATEMENT_TYPE, _env_secrets, _scrub, redact_command_line
from kvpreflight.record.verify import FLEET_PREDICATE_TYPE, RECORD_SUBJECT_PREFIX

RECORD_SUFFIX = ".dsse.json"


def record_name(deployment: str) -> str:
    return f"{deployment}{RECORD_SUFFIX}"


def check_record_path(record: Path, deployments: Sequence[str]) -> None:
    """Before anything runs: the fleet record must not take a deployment record's place."""
    if record.name in {record_name(d) for d in deployments}:
        raise FleetError(f"--record {record}: that file name is a deployment's record ({record.name}); choose another, e.g. fleet{RECORD_SUFFIX}")


def _not_measured_statement(outcome: Outcome, report: FleetReport, subjects: list[Subject], command_line: list[str]) -> dict[str, Any]:
    from kvpreflight.model import CheckResult, Report, Status

    stand_in = Report(
        tool_version=report.tool_version, engines=(),
        checks=(CheckResult(FLEET_CHECK_ID, Status.INCONCLUSIVE, f"not measured: {outcome.reason}", outcome.deployment,
                            {"host": outcome.host, "node": outcome.node}),),
        started_at=report.started_at, finished_at=report.finished_at,
    )
    return build_statement(stand_in, command_line=[*command_line, f"[deployment {outcome.deployment}]"], subjects=subjects)


def _envelope(statement: Mapping[str, Any], signer: SigningKey | None) -> dict[str, Any]:
    return sign_statement(dict(statement), signer) if signer is not None else unsigned_envelope(dict(statement))


def write_fleet_records(report: FleetReport, *, record: Path, signer: SigningKey | None, subjects: list[Subject],
                        command_line: list[str]) -> dict[str, str]:
    """Write every deployment's record and the fleet record; returns deployment -> record path."""
    folder = record.parent if str(record.parent) else Path(".")
    written: dict[str, str] = {}
    record_subjects: list[Subject] = []
    for outcome in report.outcomes:
        statement = outcome.statement or _not_measured_statement(outcome, report, subjects, command_line)
        path = write_record(folder / record_name(outcome.deployment), _envelope(statement, signer))
        written[outcome.deployment] = str(path)
        record_subjects.append(Subject(f"{RECORD_SUBJECT_PREFIX}{path.name}", hashlib.sha256(path.read_bytes()).hexdigest()))
    statement = fleet_statement(report, subjects=[*subjects, *record_subjects], command_line=command_line,
                                records={k: os.path.basename(v) for k, v in written.items()})
    write_record(record, _envelope(statement, signer))
    return written


def fleet_statement(report: FleetReport, *, subjects: list[Subject], command_line: list[str],
                    records: dict[str, str]) -> dict[str, Any]:
    argv, dropped = redact_command_line(command_line)
    secrets = sorted({s for s in [*dropped, *_env_secrets()] if len(s) >= 8}, key=len, reverse=True)
    summary = fleet_to_dict(report, records)
    predicate = {
        "schema_version": 1,
        "tool": summary["tool"],
        "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": socket.gethostname(),
        "command_line": argv,
        "fleet": summary["fleet"],
        "runner": summary["runner"],
        "started_at": summary["started_at"],
        "finished_at": summary["finished_at"],
        "counts": summary["counts"],
        "deployments": summary["deployments"],
        "verdict": summary["verdict"],
        "exit_code": summary["exit_code"],
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [s.to_dict() for s in subjects],
        "predicateType": FLEET_PREDICATE_TYPE,
        "predicate": _scrub(predicate, secrets),
    }
