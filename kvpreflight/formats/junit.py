"""JUnit XML: one testsuite, one testcase per check result, for CI test-report viewers.

fail -> <failure>; inconclusive -> <error> (could not measure is not a pass); skip ->
<skipped message=reason>; warn -> passed, with the warning in <system-out>.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from kvpreflight.formats import _common
from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import CheckResult, Report, Status

_xml_text = _common.visible  # XML 1.0 cannot carry control characters, even escaped


def _evidence(check: CheckResult) -> str:
    return json.dumps(dict(check.evidence), indent=2, sort_keys=True, default=str) if check.evidence else ""


class JunitFormat(ReportFormat):
    name = "junit"

    def render(self, report: Report) -> str:
        n = _common.counts(report)
        suite = ET.Element(
            "testsuite",
            {
                "name": "kvpreflight",
                "tests": str(len(report.checks)),
                "failures": str(n[Status.FAIL]),
                "errors": str(n[Status.INCONCLUSIVE]),
                "skipped": str(n[Status.SKIP]),
            },
        )
        if report.started_at:
            suite.set("timestamp", report.started_at)
        props = ET.SubElement(suite, "properties")
        for key, value in (
            ("kvpreflight.version", report.tool_version),
            ("verdict", _common.verdict_line(report)),
            ("exit_code", str(report.exit_code)),
        ):
            ET.SubElement(props, "property", {"name": key, "value": _xml_text(value)})
        for check in report.checks:
            suite.append(self._testcase(check))
        if report.waivers:
            out = ET.SubElement(suite, "system-out")
            out.text = _xml_text("waivers:\n" + "\n".join(_common.waiver_lines(report)))
        ET.indent(suite)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"

    def _testcase(self, check: CheckResult) -> ET.Element:
        case = ET.Element(
            "testcase",
            {"name": _xml_text(_common.check_name(check)), "classname": _xml_text(f"kvpreflight.{check.id}")},
        )
        location = _common.source_location(check)
        if location:
            case.set("file", _xml_text(location[0]))
            if location[1] is not None:
                case.set("line", str(location[1]))
        message = _xml_text(check.message)
        child_tag = {Status.FAIL: "failure", Status.INCONCLUSIVE: "error"}.get(check.status)
        if child_tag:
            child = ET.SubElement(case, child_tag, {"message": message, "type": check.status.value})
            child.text = _xml_text("\n\n".join(filter(None, [check.message, _evidence(check)])))
        elif check.status is Status.SKIP:
            ET.SubElement(case, "skipped", {"message": message})
        else:  # pass and warn both pass; the message (and for warn, the warning) goes to system-out
            out = ET.SubElement(case, "system-out")
            prefix = "WARNING: " if check.status is Status.WARN else ""
            out.text = _xml_text(prefix + check.message)
        return case
