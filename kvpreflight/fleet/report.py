"""The fleet's answer: one outcome per deployment, a verdict, and what each row shows.

fail beats inconclusive beats pass, as for one deployment; a fleet with a deployment that was not
measured is never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpreflight.fleet.job import Outcome
from kvpreflight.model import CheckResult, Report, Status, exit_code_of

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
    def verdict(self) -> str:
        verdicts = {o.verdict for o in self.outcomes}
        if "fail" in verdicts:
            return "fail"
        if "inconclusive" in verdicts or not self.outcomes:
            return "inconclusive"
        return "pass"

    @property
    def exit_code(self) -> int:
        return exit_code_of(Status(self.verdict))

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "inconclusive": 0}
        for o in self.outcomes:
            out[o.verdict] += 1
        return out


def _predicate(outcome: Outcome) -> dict[str, Any]:
    return dict((outcome.statement or {}).get("predicate") or {})


def pools(outcome: Outcome) -> list[dict[str, Any]]:
    """Per engine: role, URL, pool and the context it was checked against."""
    out = []
    for e in _predicate(outcome).get("engines") or []:
        contexts = [c for c in (e.get("context_served"), e.get("context_checked")) if isinstance(c, int)]
        out.append({"role": e.get("role"), "url": e.get("url"), "kv_pool_tokens": e.get("kv_pool_tokens"),
                    "context": max(contexts) if contexts else None})
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


def not_passed(outcome: Outcome) -> list[tuple[str, str]]:
    """(check id, status) of every check that failed or was inconclusive, in order, once each."""
    seen: dict[str, str] = {}
    for c in _predicate(outcome).get("checks") or []:
        if isinstance(c, dict) and c.get("status") in ("fail", "inconclusive"):
            old = seen.get(c.get("id"))
            if old != "fail":
                seen[str(c.get("id"))] = c["status"]
    return list(seen.items())


def problems(outcome: Outcome) -> str:
    if outcome.statement is None:
        return outcome.reason or "not measured"
    ids = ", ".join(cid if status == "fail" else f"{cid} (inconclusive)" for cid, status in not_passed(outcome)) or "-"
    if outcome.verdict == "inconclusive":  # nothing failed: say why it could not be measured
        why = next((c.get("message") for c in _predicate(outcome).get("checks") or []
                    if isinstance(c, dict) and c.get("status") == "inconclusive"), None)
        if why:
            why = " ".join(str(why).split())
            ids += f": {why[:160]}{'…' if len(why) > 160 else ''}"
    return ids


def where(outcome: Outcome) -> str:
    host = outcome.host or "-"
    return f"{host} (node {outcome.node[:8]})" if outcome.node else host


def fleet_to_dict(report: FleetReport, records: dict[str, str] | None = None) -> dict[str, Any]:
    records = records or {}
    return {
        "schema_version": 1,
        "kind": "fleet",
        "tool": {"name": "kvpreflight", "version": report.tool_version},
        "fleet": report.name,
        "inventory": report.inventory,
        "runner": report.runner,
        "verdict": report.verdict,
        "exit_code": report.exit_code,
        "counts": report.counts(),
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "deployments": [
            {
                "name": o.deployment, "verdict": o.verdict, "exit_code": o.exit_code, "host": o.host, "node": o.node,
                "elapsed_s": o.elapsed_s, "reason": o.reason, "engines": pools(o),
                "not_passed": [{"id": cid, "status": status} for cid, status in not_passed(o)],
                "record": records.get(o.deployment),
            }
            for o in report.outcomes
        ],
    }


def merged_report(report: FleetReport) -> Report:
    """Every deployment's checks in one Report, each message led by its deployment's name, for the
    formats that list checks (junit, sarif, github, markdown)."""
    checks: list[CheckResult] = []
    for o in report.outcomes:
        if o.statement is None:
            checks.append(CheckResult(FLEET_CHECK_ID, Status.INCONCLUSIVE, f"[{o.deployment}] {o.reason}", o.deployment))
            continue
        for c in _predicate(o).get("checks") or []:
            try:
                status = Status(c.get("status"))
            except ValueError:
                status = Status.INCONCLUSIVE
            checks.append(CheckResult(str(c.get("id")), status, f"[{o.deployment}] {c.get('message', '')}",
                                      c.get("endpoint") or o.deployment, dict(c.get("evidence") or {})))
    return Report(tool_version=report.tool_version, engines=(), checks=tuple(checks),
                  started_at=report.started_at, finished_at=report.finished_at)
