"""JSON report: the report schema (kvpreflight.schema), as JSON."""

from __future__ import annotations

import json

from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import Report


class JsonFormat(ReportFormat):
    name = "json"

    def render(self, report: Report) -> str:
        return json.dumps(report.to_dict(), indent=2, sort_keys=False, default=str) + "\n"
