"""SARIF 2.1.0, for code-scanning dashboards: one rule per check id, one result per finding.

Levels: fail -> "error", warn -> "warning", inconclusive -> "error". Inconclusive is reported as an
error on purpose: it means nothing was proved safe and kvpreflight exits 3, and the consumers of
SARIF (GitHub code scanning's PR gate, most dashboards) gate on "error" and let a "note" through.
SARIF's own way to say "could not tell" (kind "open") forces level "none", which those consumers
drop entirely. Each inconclusive result says so in its message and in properties.status.
pass and skip produce no result; their rules are still listed, so the rule set shows what ran.

Location: a check whose evidence has `file` (and `line`) - what `review` reports about a config
file - gets a physicalLocation; otherwise the endpoint URL is a logicalLocation.
A waived check's result carries a suppression with the waiver's reason.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from kvpreflight.formats import _common
from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import CheckResult, Report, Status

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

LEVELS = {Status.FAIL: "error", Status.WARN: "warning", Status.INCONCLUSIVE: "error"}


def _uri(path: str) -> str:
    """A relative path stays a relative URI reference; an absolute one becomes a file:// URI."""
    if PurePosixPath(path).is_absolute():
        return PurePosixPath(path).as_uri()
    if PureWindowsPath(path).is_absolute():
        return PureWindowsPath(path).as_uri()
    return path.replace("\\", "/")


def _location(check: CheckResult) -> dict[str, Any] | None:
    where = _common.source_location(check)
    if where is not None:
        physical: dict[str, Any] = {"artifactLocation": {"uri": _uri(where[0])}}
        if where[1] is not None:
            physical["region"] = {"startLine": where[1]}
        return {"physicalLocation": physical}
    if check.endpoint:
        return {"logicalLocations": [{"fullyQualifiedName": check.endpoint, "kind": "resource"}]}
    return None


def _result(check: CheckResult, rule_index: int, waivers: dict[str, str]) -> dict[str, Any]:
    text = check.message
    if check.status is Status.INCONCLUSIVE:
        text = f"inconclusive (nothing proved safe): {text}"
    if check.endpoint and _common.source_location(check) is not None:
        text += f" [{check.endpoint}]"
    result: dict[str, Any] = {
        "ruleId": check.id,
        "ruleIndex": rule_index,
        "level": LEVELS[check.status],
        "message": {"text": text},
        "properties": {"status": check.status.value, "evidence": dict(check.evidence)},
    }
    location = _location(check)
    if location is not None:
        result["locations"] = [location]
    if check.id in waivers:
        result["suppressions"] = [{"kind": "external", "justification": waivers[check.id]}]
    return result


def report_to_sarif(report: Report) -> dict[str, Any]:
    rule_ids = list(dict.fromkeys(c.id for c in report.checks))
    rules = [{"id": rid, "name": rid, "shortDescription": {"text": f"kvpreflight check {rid}"}} for rid in rule_ids]
    waivers = {w.check_id: w.reason for w in report.waivers}
    results = [_result(c, rule_ids.index(c.id), waivers) for c in report.checks if c.status in LEVELS]
    invocation: dict[str, Any] = {
        "executionSuccessful": True,
        "exitCode": report.exit_code,
        "properties": {"verdict": report.verdict.value, "summary": _common.verdict_line(report)},
    }
    if report.started_at:
        invocation["startTimeUtc"] = report.started_at
    if report.finished_at:
        invocation["endTimeUtc"] = report.finished_at
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "kvpreflight",
                        "version": report.tool_version,
                        "rules": rules,
                    }
                },
                "invocations": [invocation],
                "results": results,
            }
        ],
    }


class SarifFormat(ReportFormat):
    name = "sarif"

    def render(self, report: Report) -> str:
        return json.dumps(report_to_sarif(report), indent=2, default=str) + "\n"
