"""SARIF 2.1.0, for code-scanning dashboards: one rule per check id, one result per finding.

Levels: fail -> "error", warn -> "warning", inconclusive -> "error". Inconclusive is reported as an
error on purpose: it means nothing was proved safe and kvpreflight exits 3, and the consumers of
SARIF (GitHub code scanning's PR gate, most dashboards) gate on "error" and let a "note" through.
SARIF's own way to say "could not tell" (kind "open") forces level "none", which those consumers
drop entirely. Each inconclusive result says so in its message and in properties.status.
pass and skip produce no result; their rules are still listed, so the rule set shows what ran.

Location: every result has a physicalLocation, which GitHub code scanning requires. A check whose
evidence has `file` (and `line`) - what `review` reports about a config file - points there; a
`check` result points at the --boot spec (or the fleet inventory) when there is one, else at
`kvpreflight/deployments/<deployment>` (--name, else the entry URL), a stable path that stands for
the deployment: no such file need exist. The endpoint URL is also a logicalLocation.
partialFingerprints (rule, deployment, endpoint) let code scanning track an alert across runs.
Rules carry fullDescription, help (text and Markdown, with the fix) and helpUri (formats/rule_help.py).
A waived check's result carries a suppression with the waiver's reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from kvpreflight.formats import _common
from kvpreflight.formats.interface import ReportFormat
from kvpreflight.formats.rule_help import INFORMATION_URL, help_uri, rule_help, rule_name
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


def deployment_path(report: Report) -> str:
    """The artifact a `check` result is about when no file names the deployment: one stable,
    repository-relative path per deployment name."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", re.sub(r"^[a-z][a-z0-9+.-]*://", "", _common.deployment_name(report))).strip("-.")
    return f"kvpreflight/deployments/{slug or 'deployment'}"


def _location(check: CheckResult, report: Report) -> dict[str, Any]:
    where = _common.source_location(check)
    physical: dict[str, Any] = {"artifactLocation": {"uri": _uri(where[0] if where else report.spec or deployment_path(report))}}
    if where is not None and where[1] is not None:
        physical["region"] = {"startLine": where[1]}
    location: dict[str, Any] = {"physicalLocation": physical}
    if check.endpoint and where is None:
        location["logicalLocations"] = [{"fullyQualifiedName": check.endpoint, "kind": "resource"}]
    return location


def _fingerprint(check: CheckResult, report: Report) -> str:
    """What stays the same across runs for one finding: the rule, the deployment, the endpoint
    (not the message, whose numbers change)."""
    key = "\0".join((check.id, _common.deployment_name(report), _common.label_url(check.endpoint)))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _rule(check_id: str) -> dict[str, Any]:
    about = rule_help(check_id)
    return {
        "id": check_id,
        "name": rule_name(check_id),
        "shortDescription": {"text": about.summary},
        "fullDescription": {"text": about.description},
        "help": {"text": about.text(), "markdown": about.markdown(check_id)},
        "helpUri": help_uri(check_id),
    }


def _result(check: CheckResult, rule_index: int, waivers: dict[str, str], report: Report) -> dict[str, Any]:
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
        "locations": [_location(check, report)],
        "partialFingerprints": {"kvpreflightFinding/v1": _fingerprint(check, report)},
    }
    if check.id in waivers:
        result["suppressions"] = [{"kind": "external", "justification": waivers[check.id]}]
    return result


def report_to_sarif(report: Report) -> dict[str, Any]:
    rule_ids = list(dict.fromkeys(c.id for c in report.checks))
    rules = [_rule(rid) for rid in rule_ids]
    waivers = {w.check_id: w.reason for w in report.waivers}
    results = [_result(c, rule_ids.index(c.id), waivers, report) for c in report.checks if c.status in LEVELS]
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
                        "informationUri": INFORMATION_URL,
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
