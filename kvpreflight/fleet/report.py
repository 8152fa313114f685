"""The fleet's answer: one outcome per deployment, a verdict, and what each row shows.

fail beats inconclusive beats pass, as for one deployment; a fleet with a deployment that was not
measured is never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvpreflight._internal.redact import cut
from kvpreflight.fleet.job import Outcome
from kvpreflight.model import CheckResult, Report, Status, combined_verdict, exit_code_of
from kvpreflight.record.predicate import FleetDeployment
from kvpreflight.schema import SCHEMA_VERSION, tool

FLEET_CHECK_ID = "fleet-run"  # the result a deployment gets when nothing could be measured


@dataclass(frozen=True)
class FleetReport:
    name: str
    runner: str
    outcomes: tuple[Outcome, ...]
    inventory: str
    started_at: str
    finished_at: str
    tool_version: str

    @property
    def verdict(self) -> Status:
        return combined_verdict(o.verdict for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.verdict)

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in (Status.PASS, Status.FAIL, Status.INCONCLUSIVE)}
        for o in self.outcomes:
            out[o.verdict.value] += 1
        return out


def pools(outcome: Outcome) -> list[dict[str, Any]]:
    """Per engine: role, URL, pool and the context it was checked against."""
    if outcome.report is None:
        return []
    out = []
    for e in outcome.report.engines:
        out.append({"role": e.role.value, "url": e.url, "kv_pool_tokens": e.pool_tokens(),
                    "context": outcome.report.checked_context(e)})
    return out


def pool_summary(outcome: Outcome) -> str:
    parts = []
    for p in pools(outcome):
        pool, ctx = p["kv_pool_tokens"], p["context"]
        if isinstance(pool, int) and isinstance(ctx, int) and ctx:
            parts.append(f"{p['role']} {pool:,}/{ctx:,} ({pool / ctx:.2f}x)")
        else:
            parts.append(f"{p['role']} {'?' if pool is None else f'{pool:,}'}/{'?' if ctx is None else f'{ctx:,}'}")
    return "; ".join(parts) or "-"


def not_passed(outcome: Outcome) -> list[tuple[str, Status]]:
    """(check id, status) of every check that failed or was inconclusive, in order, once each."""
    seen: dict[str, Status] = {}
    for c in outcome.report.checks if outcome.report is not None else ():
        if c.status in (Status.FAIL, Status.INCONCLUSIVE) and seen.get(c.id) is not Status.FAIL:
            seen[c.id] = c.status
    return list(seen.items())


def problems(outcome: Outcome) -> str:
    if outcome.report is None:
        return outcome.reason or "not measured"
    ids = ", ".join(cid if status is Status.FAIL else f"{cid} (inconclusive)" for cid, status in not_passed(outcome)) or "-"
    if outcome.verdict is Status.INCONCLUSIVE:  # nothing failed: say why it could not be measured
        why = next((c.message for c in outcome.report.checks if c.status is Status.INCONCLUSIVE), None)
        if why:
            why = " ".join(why.split())
            ids += f": {cut(why, 160)}"
    return ids


def where(outcome: Outcome) -> str:
    host = outcome.host or "-"
    return f"{host} (node {outcome.node[:8]})" if outcome.node else host


def deployment_summary(outcome: Outcome, record: str | None = None) -> FleetDeployment:
    """The deployment's line in the fleet's JSON report and in the fleet record."""
    return FleetDeployment(
        name=outcome.deployment, verdict=outcome.verdict, exit_code=outcome.exit_code, host=outcome.host,
        node=outcome.node, elapsed_s=outcome.elapsed_s, reason=outcome.reason, engines=tuple(pools(outcome)),
        not_passed=tuple({"id": cid, "status": status.value} for cid, status in not_passed(outcome)), record=record,
    )


def fleet_to_dict(report: FleetReport, records: dict[str, str] | None = None) -> dict[str, Any]:
    records = records or {}
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "fleet",
        "tool": tool(report.tool_version),
        "fleet": report.name,
        "inventory": report.inventory,
        "runner": report.runner,
        "verdict": report.verdict.value,
        "exit_code": report.exit_code,
        "counts": report.counts(),
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "deployments": [deployment_summary(o, records.get(o.deployment)).to_dict() for o in report.outcomes],
    }


def merged_report(report: FleetReport) -> Report:
    """Every deployment's checks in one Report, each message led by its deployment's name, for the
    formats that list checks (junit, sarif, github, markdown)."""
    checks: list[CheckResult] = []
    for o in report.outcomes:
        if o.report is None:
            checks.append(CheckResult(id=FLEET_CHECK_ID, status=Status.INCONCLUSIVE, message=f"[{o.deployment}] {o.reason}",
                                      endpoint=o.deployment))
            continue
        checks.extend(replace(c, message=f"[{o.deployment}] {c.message}", endpoint=c.endpoint or o.deployment)
                      for c in o.report.checks)
    return Report(tool_version=report.tool_version, engines=(), checks=tuple(checks),
                  started_at=report.started_at, finished_at=report.finished_at, name=report.name, spec=report.inventory)
