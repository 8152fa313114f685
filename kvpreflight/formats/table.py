"""The human report: a block per engine, the checks, the waivers, then one verdict line.

Colour only on a terminal (and never with NO_COLOR). Checks are listed failures first. On a
terminal a passing check's message is one line (cut with "…"), any other at most three lines (its
leading findings and its fix, then where the rest is: `_common.brief`); JSON keeps every message
whole. On a terminal the checks are one row each, their columns measured without colour codes
and summing to the terminal's width, and a long message wraps inside the message column only (a
long endpoint inside its own); below STACK_BELOW columns each check stacks (status and id, then its
endpoint and message indented). Anywhere else each message is kept whole on its row. Control
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
_MIN_ENDPOINT_WIDTH = 16
_GAP = "  "
STACK_BELOW = 60  # columns: narrower than this, a row of four columns leaves the message no room


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
        # a pass is one line on a terminal; its whole message is in JSON and Markdown
        table, shortened = _columns(headers, rows, width, one_line=[r.status is Status.PASS for r in shown])
        note = f"\n{_common.SHORTENED_NOTE}" if shortened else ""
        return f"Checks ({_common.counts_text(report)})\n" + table + note


def _columns(headers: list[str], rows: list[list[str]], width: int | None, one_line: list[bool]) -> tuple[str, bool]:
    """The checks, one row each, in tabulate's "simple" look. With a width: the message column
    takes what the others leave and wraps within itself (the endpoint shrinks to its minimum and
    wraps within itself first); below STACK_BELOW, or when even that leaves no room, each row
    stacks; the rows marked `one_line` keep one line of message, cut with "…", the others at most
    MESSAGE_LINES (`_common.brief`: the leading findings and the fix). Without one (a pipe, a file)
    nothing wraps or is cut. Also says whether a message other than a pass's was shortened."""
    widths = [max(_common.visible_len(text) for text in [h, *(r[i] for r in rows)]) for i, h in enumerate(headers)]
    shortened = False
    if width:
        # checks grouped under one finding wrap within their own column, one id per piece at least
        widths[1] = min(widths[1], max(len(headers[1]), *(_common.visible_len(part) + 1 for r in rows
                                                          for part in r[1].split(", "))))
        fixed = widths[0] + widths[1] + 3 * len(_GAP)
        room = width - fixed - widths[2]
        if room < _MIN_MESSAGE_WIDTH:
            widths[2] = max(_MIN_ENDPOINT_WIDTH, min(widths[2], width - fixed - _MIN_MESSAGE_WIDTH))
            room = width - fixed - widths[2]
        stacked = width < STACK_BELOW or room < _MIN_MESSAGE_WIDTH
        message_width = max(width - 4, 20) if stacked else room
        briefs = [row[3] if short else _common.brief(row[3], message_width) for row, short in zip(rows, one_line, strict=True)]
        shortened = any(text != row[3] for text, row in zip(briefs, rows, strict=True))
        rows = [[*row[:3], _one_line(row[3], message_width) if short else text]
                for row, short, text in zip(rows, one_line, briefs, strict=True)]
        if stacked:
            return _stacked(rows, width), shortened
        widths[3] = min(widths[3], room)
    lines = [_line(headers, widths), _GAP.join("-" * w for w in widths)]
    for row in rows:
        cells = [[row[0]], _wrap(row[1], widths[1] if width else None), _wrap(row[2], widths[2] if width else None),
                 _wrap(row[3], widths[3] if width else None)]
        for i in range(max(len(c) for c in cells)):
            lines.append(_line([c[i] if i < len(c) else "" for c in cells], widths))
    return "\n".join(lines), shortened


def _line(cells: list[str], widths: list[int]) -> str:
    padded = [cell + " " * (w - _common.visible_len(cell)) for cell, w in zip(cells, widths, strict=True)]
    return _GAP.join(padded).rstrip()


def _wrap(text: str, width: int | None) -> list[str]:
    if not width:
        return text.split("\n")
    return [piece for line in text.split("\n") for piece in _common.wrap(line, width)]


def _stacked(rows: list[list[str]], width: int) -> str:
    """A narrow terminal: per check, status and id, then endpoint and message indented under them."""
    lines = []
    for status, check_id, endpoint, message in rows:
        lines += _wrap(f"{status} {check_id}", None)
        for text in (endpoint, message) if endpoint != "-" else (message,):
            lines += ["    " + piece for piece in _wrap(text, max(width - 4, 20))]
    return "\n".join(lines)


def _one_line(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if _common.visible_len(line) <= width else line[: width - 1].rstrip() + "…"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
