"""Render a fleet report: a table with one row per deployment, JSON, or any check format.

`table` and `json` are the fleet's own; junit, sarif, github and markdown render the merged
report (every deployment's checks, named by deployment) with the check formats.
"""

from __future__ import annotations

import json

from tabulate import tabulate

from kvpreflight.fleet.report import FleetReport, fleet_to_dict, merged_report, pool_summary, problems, where

FLEET_FORMATS = ("table", "json")


def render_table(report: FleetReport) -> str:
    rows = [(o.deployment, o.verdict.value.upper(), where(o), pool_summary(o), problems(o)) for o in report.outcomes]
    counts = report.counts()
    table = tabulate(rows, headers=("deployment", "verdict", "ran on", "KV pool / context per engine", "failing checks or reason"),
                     tablefmt="simple", disable_numparse=True)
    summary = (f"fleet {report.name}: {report.verdict.value.upper()} — {len(report.outcomes)} deployment(s): "
               f"{counts['pass']} pass, {counts['fail']} fail, {counts['inconclusive']} inconclusive (runner: {report.runner})")
    return f"{table}\n\n{summary}\n"


def render(report: FleetReport, fmt: str, records: dict[str, str] | None = None) -> str:
    if fmt == "table":
        return render_table(report)
    if fmt == "json":
        return json.dumps(fleet_to_dict(report, records), indent=2) + "\n"
    from kvpreflight.formats import get_format

    return get_format(fmt).render(merged_report(report))
