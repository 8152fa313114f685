"""The human report: a block per engine, the checks, the waivers, then one verdict line.

Colour only on a terminal (and never with NO_COLOR). Checks are listed failures first; on a
terminal a passing check is one line (its message cut with "…") and every other message wraps to
the terminal's width; anywhere else each message is kept whole (and always in JSON and Markdown). Control
characters in any value are written out as \\xNN, so a value cannot drive the terminal.
"""

from __future__ import annotations

import sys

from tabulate import tabulate

from kvpreflight.formats import _common
from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import Report, Status

_COLOUR = {
    Status.FAIL: "\x1b[1;31m",
    Status.INCONCLUSIVE: "\x1b[1;35m",
    Status.WARN: "\x1b[33m",
    Status.SKIP: "\x1b[2m",
    Status.PASS: "\x1b[32m",
}
_RESET = "\x1b[0m"
_MIN_MESSAGE_WIDTH = 24


class TableFormat(ReportFormat):
    name = "table"

    def __init__(self, *, color: bool | None = None, width: int | None = None, quiet: bool = False) -> None:
        """color/width None: decided at render time from stdout (a terminal gets colour and wrapping).
        quiet: the passing checks are left out (counted in the verdict line)."""
        self.color = color
        self.width = width
        self.quiet = quiet

    def _paint(self, status: Status, text: str, color: bool) -> str:
        return f"{_COLOUR[status]}{text}{_RESET}" if color else text

    def render(self, report: Report) -> str:
        color = _common.colour_wanted(sys.stdout) if self.color is None else self.color
        width = self.width if self.width is not None else _common.output_width(sys.stdout)
        parts = [f"kvpreflight {_common.visible(report.tool_version)}"]
        if report.entry:
            parts[0] += f" via {_common.visible(report.entry)}"
        for i, engine in enumerate(report.engines, 1):
            facts = [(label, _common.visible(value)) for label, value in _common.engine_facts(report, engine, compact=True)]
            parts.append(f"Engine {i} of {len(report.engines)}\n" + _indent(tabulate(facts, tablefmt="plain")))
        if not report.engines and any(c.endpoint and "://" in c.endpoint for c in report.checks):
            parts.append("Engines: none could be read (see the checks below)")
        parts.append(self._checks(report, color, width))
        if cost := _common.cost_lines(report):
            parts.append("Cost to the engines:\n" + _common.visible("\n".join(f"  {line}" for line in cost)))
        if report.waivers:
            waivers = _common.visible("\n".join(f"  - {line}" for line in _common.waiver_lines(report)))
            parts.append("Waivers:\n" + waivers)
        parts.append(self._paint(report.verdict, _common.visible(_common.verdict_line(report)), color))
        return _common.fit("\n\n".join(parts), width) + "\n"

    def _checks(self, report: Report, color: bool, width: int | None) -> str:
        if not report.checks:
            return "Checks: none ran"
        # Failures first, passes last (or left out with quiet); the same finding once.
        shown = _common.report_rows(report, quiet=self.quiet)
        if not shown:
            return f"Checks ({_common.counts_text(report)}): every check passed (--quiet leaves them out)"
        rows = [
            [self._paint(r.status, r.status.value.upper(), color)]
            + [_common.visible(text) for text in (r.check, r.endpoint, r.message)]
            for r in shown
        ]
        headers = ["status", "check", _common.where_label(report), "message"]
        maxcolwidths = None
        if width:
            # Room left for the message once the other columns fit: tabulate pads each header by
            # 2 and puts 2 spaces between columns.
            used = sum(
                max(len(h) + 2, *(len(_strip(str(r[i]))) for r in rows)) + 2 for i, h in enumerate(headers[:3])
            )
            message_width = max(_MIN_MESSAGE_WIDTH, width - used)
            maxcolwidths = [None, None, None, message_width]
            for row, r in zip(rows, shown, strict=True):
                if r.status is Status.PASS:  # a pass is one line; its whole message is in JSON and Markdown
                    row[3] = _one_line(row[3], message_width)
        table = tabulate(rows, headers=headers, tablefmt="simple", maxcolwidths=maxcolwidths)
        return f"Checks ({_common.counts_text(report)})\n" + table


def _one_line(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def _strip(text: str) -> str:
    for code in (*_COLOUR.values(), _RESET):
        text = text.replace(code, "")
    return text


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
