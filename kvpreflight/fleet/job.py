"""One deployment's check, run where the runner placed it (a thread here, a Ray task on a node).

Attach targets are checked in this process. Boot and builtin targets run in a child process
(`python -m kvpreflight.fleet.worker`) that boots, checks and stops the engines; it dies with its
parent (PR_SET_PDEATHSIG), so a killed Ray worker or node takes no engine with it, and it is
stopped at the deployment's deadline. Either way the result is an unsigned in-toto statement,
built here with the logs and the host it ran on; the driver signs it (the key never travels).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from kvpreflight._internal.builtin_engine.deployment import BuiltinDeployment
from kvpreflight._internal.files import FileKind, read_tail, read_text, writing
from kvpreflight._internal.redact import cut
from kvpreflight.errors import ConfigError
from kvpreflight.fleet.inventory import AttachTarget, BootTarget, Deployment
from kvpreflight.model import Report, RouterKind, Status, Waiver, exit_code_of
from kvpreflight.schema import report_from_dict

STOP_GRACE_S = 30.0  # after a deadline: time a worker gets to stop its engines before SIGKILL
PARENT_ENV = "KVPREFLIGHT_FLEET_PARENT"


@dataclass(frozen=True, kw_only=True)
class WorkerJob:
    """What `python -m kvpreflight.fleet.worker` is given on stdin: one boot or builtin deployment,
    its whole waivers (an expiry travels into the record, where `verify` refuses it once past), and
    where the worker writes."""

    name: str
    target: BootTarget | BuiltinDeployment
    waivers: tuple[Waiver, ...]
    subjects: tuple[str, ...]
    command_line: tuple[str, ...]
    record: str  # the unsigned record's path
    report: str  # the JSON report's path
    log_dir: str

    def to_json(self) -> str:
        from kvpreflight.schema import waiver_to_dict

        kind = "boot" if isinstance(self.target, BootTarget) else "builtin"
        return json.dumps({**{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("waivers", "target")},
                           "target": {"kind": kind, **asdict(self.target)},
                           "waivers": [waiver_to_dict(w) for w in self.waivers]})

    @classmethod
    def from_json(cls, text: str) -> WorkerJob:
        data = json.loads(text)
        waivers = tuple(Waiver(w["check_id"], w["reason"], w.get("until")) for w in data.pop("waivers"))
        target = dict(data.pop("target"))
        made: BootTarget | BuiltinDeployment
        if target.pop("kind") == "boot":
            made = BootTarget(**{**target, "fixed_ports": tuple(target["fixed_ports"])})
        else:
            made = BuiltinDeployment(**{**target, "faults": tuple(target["faults"]), "router": RouterKind(target["router"])})
        return cls(**{**data, "target": made, "waivers": waivers, "subjects": tuple(data["subjects"]),
                      "command_line": tuple(data["command_line"])})


@dataclass(frozen=True)
class JobSettings:
    command_line: tuple[str, ...]  # the fleet's argv (secrets redacted when the record is built)
    subjects: tuple[str, ...] = ()  # NAME=sha256:HEX every record carries (inventory, --subject)
    work_dir: str | None = None  # boot logs go under it; default a new temporary folder per deployment
    keep: bool = True  # the logs outlive the run; False: work_dir is temporary, and one made here is removed


@dataclass(frozen=True)
class Outcome:
    deployment: str
    verdict: Status  # pass | fail | inconclusive
    exit_code: int
    statement: Mapping[str, Any] | None = None  # unsigned, as built where it ran; None: nothing measured
    reason: str | None = None  # why nothing was measured
    host: str | None = None
    node: str | None = None  # the Ray node id, when Ray ran it
    elapsed_s: float = 0.0
    report: Report | None = None  # what was measured (None: nothing); the fleet renders from it


def not_measured(deployment: str, reason: str, **extra: Any) -> Outcome:
    return Outcome(deployment, Status.INCONCLUSIVE, exit_code_of(Status.INCONCLUSIVE), None, " ".join(reason.split()), **extra)


def run_batch(batch: Sequence[Deployment], settings: JobSettings) -> tuple[Outcome, ...]:
    """Check each deployment in turn (a batch shares engines, so never two at once)."""
    return tuple(run_deployment(d, settings) for d in batch)


def run_deployment(deployment: Deployment, settings: JobSettings) -> Outcome:
    from kvpreflight.errors import KvpreflightError

    started = time.monotonic()
    host = socket.gethostname()
    try:
        if isinstance(deployment.target, AttachTarget):
            outcome = _attached(deployment, settings)
        else:
            outcome = _booted(deployment, settings)
    except KvpreflightError as exc:
        outcome = not_measured(deployment.name, f"{'configuration error: ' if exc.exit_code == 2 else ''}{exc}")
    except Exception as exc:  # fail closed: a crash is "not measured", never a pass, never a lost row
        outcome = not_measured(deployment.name, f"internal error: {type(exc).__name__}: {exc}")
    return replace(outcome, host=host, elapsed_s=round(time.monotonic() - started, 3))


def _subjects(deployment: Deployment, settings: JobSettings) -> list[str]:
    return [*settings.subjects, *deployment.subjects]


def _command_line(deployment: Deployment, settings: JobSettings) -> list[str]:
    return [*settings.command_line, f"[deployment {deployment.name}]"]


def _outcome(name: str, report: Report, statement: Mapping[str, Any]) -> Outcome:
    return Outcome(name, report.verdict, report.exit_code, statement, report=report)


def _attached(deployment: Deployment, settings: JobSettings) -> Outcome:
    from kvpreflight import preflight
    from kvpreflight.record import build_statement, parse_subjects

    t = deployment.target
    assert isinstance(t, AttachTarget)
    plan = t.plan(deployment.waivers)
    preflight.validate(plan)
    report = preflight.run(plan)
    statement = build_statement(report, command_line=_command_line(deployment, settings),
                                subjects=parse_subjects(_subjects(deployment, settings)),
                                files_read=list(plan.logs.values()), secrets=plan.auth.secrets)
    return _outcome(deployment.name, report, statement)


def _booted(deployment: Deployment, settings: JobSettings) -> Outcome:
    base = Path(settings.work_dir) if settings.work_dir else Path(tempfile.mkdtemp(prefix="kvpreflight-fleet-"))
    try:
        return _boot_in(base, deployment, settings)
    finally:
        if not settings.work_dir and not settings.keep:  # made here; the record and the report were read back
            shutil.rmtree(base, ignore_errors=True)


def _boot_in(base: Path, deployment: Deployment, settings: JobSettings) -> Outcome:
    from kvpreflight.record import read_record

    work = base / deployment.name
    work.mkdir(parents=True, exist_ok=True)
    record = work / "unsigned-record.json"
    report_path = work / "report.json"  # the typed Report the fleet renders, read back below
    record.unlink(missing_ok=True)
    report_path.unlink(missing_ok=True)
    assert not isinstance(deployment.target, AttachTarget)  # checked in this process, never by a worker
    job = WorkerJob(name=deployment.name, target=deployment.target, waivers=deployment.waivers,
                    subjects=tuple(_subjects(deployment, settings)), command_line=tuple(_command_line(deployment, settings)),
                    record=str(record), report=str(report_path), log_dir=str(work / "logs"))
    log_path = work / "worker.log"
    log_named = f"log {log_path}" if settings.keep else "its log is removed with the run's other logs; --keep keeps them"
    with writing(log_path) as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvpreflight.fleet.worker"], stdin=subprocess.PIPE, stdout=log, stderr=log,
            env={**os.environ, PARENT_ENV: str(os.getpid())}, close_fds=True,
        )
        try:
            assert proc.stdin is not None
            proc.stdin.write(job.to_json().encode())
            proc.stdin.close()
            proc.wait(timeout=deployment.timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return not_measured(deployment.name, f"did not finish within its deadline of {deployment.timeout_s:g}s "
                                                 f"(timeout_s); engines stopped; worker {log_named}")
        except BaseException:
            _stop(proc)
            raise
    if record.is_file() and report_path.is_file():
        envelope = read_record(record)
        return _outcome(deployment.name, report_from_dict(json.loads(read_text(report_path, FileKind.WORKER_OUTPUT))),
                        json.loads(envelope.payload))
    return not_measured(deployment.name, f"{_last_line(log_path)} (worker exit status {proc.returncode}; {log_named})")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the worker then stops its engines), SIGKILL if it is still there after the grace."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in read_tail(path, FileKind.WORKER_OUTPUT).splitlines() if line.strip()]
    except ConfigError:
        lines = []
    errors = [line for line in lines if line.startswith("kvpreflight: error:")]
    line = (errors or lines or ["the worker wrote nothing"])[-1]
    return cut(line.removeprefix("kvpreflight: error: "), 400)
