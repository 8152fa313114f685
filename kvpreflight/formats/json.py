"""JSON report: the report schema (kvpreflight.schema), as JSON."""

from __future__ import annotations

import json

from kvpreflight import schema
from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import Report


class JsonFormat(ReportFormat):
    name = "json"

    def render(self, report: Report) -> str:
        return json.dumps(schema.report_to_dict(report), indent=2, sort_keys=False, default=str) + "\n"
