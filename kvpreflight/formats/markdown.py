"""A Markdown summary ready for a PR comment or `$GITHUB_STEP_SUMMARY`.

Verdict headline, an engines table, a checks table (each message at most three lines of a
MARKDOWN_WIDTH column: `_common.brief`; the JSON report keeps it whole), the waivers. Every value is
escaped so that a message can neither break a table (`|`, newlines) nor inject HTML or Markdown markup.
"""

from __future__ import annotations

from kvpreflight.formats import _common
from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import Report, Status

ICONS = {
    Status.PASS: "✅",
    Status.FAIL: "❌",
    Status.INCONCLUSIVE: "❓",
    Status.WARN: "⚠️",
    Status.SKIP: "⏭️",
}

_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "|": "\\|",
    "\\": "\\\\",
    "`": "\\`",
    "*": "\\*",
    "_": "\\_",
    "[": "\\[",
    "]": "\\]",
}


def escape(text: str) -> str:
    """One table cell: markup characters escaped, line breaks as <br>."""
    out = "".join(_ESCAPES.get(ch, ch) for ch in text.replace("\r\n", "\n").replace("\r", "\n"))
    return out.replace("\n", "<br>")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(escape(cell) for cell in row) + " |" for row in rows]
    return lines


def pool_chart(report: Report) -> list[str]:
    """Each engine's KV pool (bars) against the context it must hold (line), as a Mermaid
    xychart GitHub renders. Engines whose pool is unknown are named under the chart."""
    known = [(e, pool) for e in report.engines if (pool := e.pool_tokens()) is not None]
    contexts = [_common.checked_context(report, e) or 0 for e, _ in known]
    if not known:
        return []
    labels = ", ".join(_chart_label(f"{e.role.value} {_host(e.url)}") for e, _ in known)
    top = max([pool for _, pool in known] + contexts)
    lines = ["", "```mermaid", "xychart-beta", '    title "KV pool vs checked context (tokens)"',
             f"    x-axis [{labels}]", f'    y-axis "tokens" 0 --> {int(top * 1.1) or 1}',
             f"    bar [{', '.join(str(pool) for _, pool in known)}]",
             f"    line [{', '.join(str(c) for c in contexts)}]", "```",
             "",
             "Bars: each engine's KV pool; line: the context it must hold (below the line, one full-context "
             "request does not fit)."]
    unknown = [e.url for e in report.engines if e.pool_tokens() is None]
    if unknown:
        lines.append(f"Pool unknown, not charted: {escape(', '.join(unknown))}.")
    return lines


def _host(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0].split("@")[-1]


def _chart_label(text: str) -> str:
    """A quoted xychart label: no quotes, brackets or line breaks can end it early."""
    return '"' + "".join(ch for ch in text if ch not in '"[]\n\r`') + '"'


class MarkdownFormat(ReportFormat):
    name = "markdown"

    def render(self, report: Report) -> str:
        out = [f"## {ICONS[report.verdict]} kvpreflight: {escape(_common.verdict_line(report))}", ""]
        if report.checks:
            out += [f"{escape(_common.counts_text(report))} (kvpreflight {escape(report.tool_version)})", ""]
        out += ["### Engines", ""]
        if report.engines:
            facts = [_common.engine_facts(report, e) for e in report.engines]
            labels = list(dict.fromkeys(label for f in facts for label, _ in f))
            rows = [[dict(f).get(label, "") for label in labels] for f in facts]
            out += _table(labels, rows)
            out += pool_chart(report)
        else:
            out.append("No engine was reached.")
        out += ["", "### Checks", ""]
        if report.checks:
            briefs = [_common.brief(c.message, _common.MARKDOWN_WIDTH) for c in report.checks]
            rows = [[f"{ICONS[c.status]} {c.status.value}", c.id, c.endpoint or "", text]
                    for c, text in zip(report.checks, briefs, strict=True)]
            out += _table(["status", "check", _common.where_label(report), "message"], rows)
            if any(text != c.message for c, text in zip(report.checks, briefs, strict=True)):
                out += ["", escape(_common.SHORTENED_NOTE)]
        else:
            out.append("No check ran.")
        if cost := _common.cost_lines(report):
            out += ["", "### Cost to the engines", ""] + [f"- {escape(line)}" for line in cost]
        if report.waivers:
            out += ["", "### Waivers", ""]
            out += _table(["check", "reason"], [[w.check_id, w.reason] for w in report.waivers])
        return "\n".join(out) + "\n"
