"""GitHub Actions workflow commands: an annotation per finding, then the verdict line.

fail -> `::error`, warn and inconclusive -> `::warning`, each titled with the check id and
placed on `file=`/`line=` when the evidence names a file (what `review` reports). Escaping follows
the Actions runner: in the message `%`, CR and LF; in properties also `:` and `,`.
"""

from __future__ import annotations

from kvpreflight.formats import _common
from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import CheckResult, Report, Status

COMMANDS = {Status.FAIL: "error", Status.WARN: "warning", Status.INCONCLUSIVE: "warning"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(name: str, message: str, **properties: str | int | None) -> str:
    """`::name k=v,k=v::message`, every part escaped; properties that are None are left out."""
    props = ",".join(f"{k}={escape_property(str(v))}" for k, v in properties.items() if v is not None)
    return f"::{name}{' ' + props if props else ''}::{escape_data(message)}"


def _annotation(check: CheckResult) -> str:
    where = _common.source_location(check)
    file, line = where if where else (None, None)
    message = check.message
    if check.status is Status.INCONCLUSIVE:
        message = f"inconclusive (nothing proved safe): {message}"
    if check.endpoint:
        message += f" [{check.endpoint}]"
    return command(COMMANDS[check.status], message, file=file, line=line, title=check.id)


def annotation_lines(report: Report) -> list[str]:
    """The workflow commands for every finding; a run with no checks at all gets one warning."""
    lines = [_annotation(c) for c in report.checks if c.status in COMMANDS]
    if not report.checks:
        lines.append(command("warning", _common.verdict_line(report), title="kvpreflight"))
    return lines


class GithubFormat(ReportFormat):
    name = "github"

    def render(self, report: Report) -> str:
        return "\n".join([*annotation_lines(report), _common.verdict_line(report)]) + "\n"
