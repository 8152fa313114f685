"""Helpers the text formats share: the verdict line, engine facts, check names, source locations.

Formats only render what the checks decided; nothing here judges. Every string that comes from a
CheckResult is its `message` or its `evidence`, which the checks keep free of response text.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

from kvpreflight.model import CheckResult, EngineSnapshot, Report, RoleSource, Status

UNKNOWN = "unknown"

# Control characters (but tab and newline), lone surrogates and non-characters: a terminal would
# obey them and XML 1.0 cannot carry them, so they are shown as \xNN instead.
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def visible(text: object) -> str:
    """The text with every control character written out as \\xNN (nothing is dropped)."""
    return _INVISIBLE.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))

# What each status means to a reader, in the order a reader wants them counted.
STATUS_ORDER = (Status.FAIL, Status.INCONCLUSIVE, Status.WARN, Status.SKIP, Status.PASS)


def tokens(n: int | None) -> str:
    """131072 -> '131,072'; None -> 'unknown'."""
    return UNKNOWN if n is None else f"{n:,}"


def checked_context(report: Report, engine: EngineSnapshot) -> int | None:
    """The context length the run checked `engine` against, as kv-capacity judged it."""
    return report.checked_context(engine)


def pool_ratio(report: Report, engine: EngineSnapshot) -> float | None:
    """KV pool tokens per checked-context token (below 1.0 one full-context request cannot fit)."""
    pool, ctx = engine.pool_tokens(), checked_context(report, engine)
    if pool is None or not ctx:
        return None
    return pool / ctx


def ratio_text(ratio: float | None) -> str:
    return UNKNOWN if ratio is None else f"{ratio:.2f}x"


def pool_sources(engine: EngineSnapshot) -> list[str]:
    """One line per reading: '/server_info max_total_num_tokens [dp0] = 131,072 (scheduler)'."""
    return [f"{r.label} = {tokens(r.tokens)} ({r.origin.value})" for r in engine.pool_readings]


def cost_lines(report: Report) -> list[str]:
    """What the check cost the engines, one line each (none when no request was sent)."""
    cost = report.cost
    if cost is None:
        return []

    def equiv(value: float | None) -> str:
        return "" if value is None else f" = {value:.1f} context-equivalents"

    lines = [
        f"{cost.requests} requests, {cost.prompt_tokens_submitted:,} prompt tokens submitted"
        f"{equiv(cost.equivalents(cost.prompt_tokens_submitted))}, {cost.generated_tokens:,} generated, {cost.wall_s:.1f} s",
        f"prefilled: {cost.prefilled_tokens:,} tokens{equiv(cost.equivalents(cost.prefilled_tokens))} ({cost.basis})",
    ]
    for e in cost.engines:
        if e.prefilled_tokens is not None:
            ctx = f" = {e.context_equivalents:.1f} of its context" if e.context_equivalents is not None else ""
            lines.append(f"{e.role.value} {e.url}: prefilled {e.prefilled_tokens:,} of {tokens(e.prompt_tokens)} prompt tokens{ctx}")
        else:
            lines.append(f"{e.role.value} {e.url}: no prefilled-token counter")
    return lines


# One vocabulary for where a role came from (the README's): engine, router, override, assumed.
ROLE_SOURCE_TEXT = {
    RoleSource.ENGINE: "engine: the engine reports it",
    RoleSource.ROUTER: "router: the router lists it",
    RoleSource.OVERRIDE: "override: ROLE=URL or the boot spec",
    RoleSource.ASSUMED: "assumed: nothing said otherwise",
}


def engine_facts(report: Report, engine: EngineSnapshot, *, compact: bool = False) -> list[tuple[str, str]]:
    """The per-engine facts a reader needs, as (label, value) pairs, in reading order. `compact`
    (the terminal table): what agrees is said once (readings of one size, one context)."""
    facts = [("url", engine.url)]
    if compact:
        facts.append(("engine", f"{engine.engine} {engine.version or '(version unknown)'}"))
    else:
        facts += [("engine", engine.engine), ("version", engine.version or UNKNOWN)]
    facts.append(("role", f"{engine.role.value} ({ROLE_SOURCE_TEXT[engine.role_source]})"))
    if engine.model:
        facts.append(("model", engine.model))
    facts.append(("KV pool tokens", tokens(engine.pool_tokens())))
    readings = engine.pool_readings
    if compact and len(readings) > 1 and len({r.tokens for r in readings}) == 1:
        origins = Counter(r.origin.value for r in readings)
        facts.append(("pool sources", f"{len(readings)} readings agree ("
                      + ", ".join(f"{origin} {n}" for origin, n in origins.items()) + "; each in JSON)"))
    else:
        facts.append(("pool sources", "\n".join(pool_sources(engine)) or "none read"))
    served, checked = engine.served_context, checked_context(report, engine)
    if compact and served == checked:
        facts.append(("context", f"{tokens(served)} (served and checked)"))
    else:
        facts += [("served context", tokens(served)), ("checked context", tokens(checked))]
    facts.append(("pool / context", ratio_text(pool_ratio(report, engine))))
    if engine.notes:
        facts.append(("notes", "\n".join(engine.notes)))
    return facts


def label_url(url: str | None) -> str:
    """A URL fit for a label or a name: scheme, host, port and path only (no credentials, no query)."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "unparseable-url"
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else url.split("?")[0].split("@")[-1]


def deployment_name(report: Report) -> str:
    """What names the deployment across runs: --name, else the entry URL, else the first engine's
    or check's endpoint (URLs without credentials or query), else "kvpreflight". Never empty."""
    for candidate in (report.name, report.entry, *(e.url for e in report.engines), *(c.endpoint for c in report.checks)):
        if candidate and (text := candidate if candidate is report.name else label_url(candidate)):
            return text
    return "kvpreflight"


def check_name(check: CheckResult) -> str:
    """What identifies one result: the check id, and the endpoint when there is one."""
    return f"{check.id} {check.endpoint}" if check.endpoint else check.id


def where_label(report: Report) -> str:
    """The name of the column that says where a result applies: `file` for a review of files
    (file:line), `endpoint` for engines."""
    files = any(source_location(c) for c in report.checks)
    return "file" if files and not any(c.endpoint and "://" in c.endpoint for c in report.checks) else "endpoint"


def source_location(check: CheckResult) -> tuple[str, int | None] | None:
    """(file, line) when the evidence points at a file (the `review` command does), else None."""
    path = check.evidence.get("file")
    if not path:
        return None
    line: Any = check.evidence.get("line")
    try:
        line = int(line) if line is not None else None
    except (TypeError, ValueError):
        line = None
    if line is not None and line < 1:
        line = None
    return str(path), line


def counts(report: Report) -> dict[Status, int]:
    return {s: report.status_count(s) for s in STATUS_ORDER}


def tally(report: Report) -> str:
    """Every status counted, worst first, zeros included, and the waivers: nothing hides a skip."""
    return ", ".join(f"{n} {s.value}" for s, n in counts(report).items()) + f"; {report.waived_count} waived"


@dataclass(frozen=True)
class ReportRow:
    """One line of the human report: results that say the same thing, grouped."""

    status: Status
    check_ids: tuple[str, ...]
    endpoints: tuple[str, ...]
    message: str

    @property
    def check(self) -> str:
        return ", ".join(self.check_ids)

    @property
    def endpoint(self) -> str:
        return ", ".join(self.endpoints) or "-"


def report_rows(report: Report, *, quiet: bool = False) -> list[ReportRow]:
    """The results in the order an operator reads them: failures, inconclusives, warnings, skips,
    then passes (none with `quiet`); results with the same status and message are one row, naming
    every check and endpoint they came from."""
    groups: dict[tuple[Status, str], list[CheckResult]] = {}
    for c in report.checks:
        groups.setdefault((c.status, c.message), []).append(c)
    rows = [
        ReportRow(status, tuple(dict.fromkeys(c.id for c in group)),
                  tuple(dict.fromkeys(c.endpoint for c in group if c.endpoint)), message)
        for (status, message), group in groups.items()
        if not (quiet and status is Status.PASS)
    ]
    return sorted(rows, key=lambda r: STATUS_ORDER.index(r.status))


def counts_text(report: Report) -> str:
    """'1 fail, 2 pass' (statuses that occur, worst first)."""
    return ", ".join(f"{n} {s.value}" for s, n in counts(report).items() if n)


def _ids(report: Report, status: Status) -> list[str]:
    return [check_name(c) for c in report.checks if c.status is status]


def verdict_line(report: Report) -> str:
    """One line: the verdict, the exit code it means, and what caused it.

    `PASS - 0 fail, 0 inconclusive, 0 warn, 0 skip, 9 pass; 0 waived`, `PASS: 1 warn (...) - ...`,
    `FAIL (exit 1): 2 failed: a, b - ...`, `INCONCLUSIVE (exit 3): nothing proved safe: could not
    measure x - ...`: the cause, then every status counted.
    """
    return f"{_verdict_cause(report)} - {tally(report)}"


def _verdict_cause(report: Report) -> str:
    verdict, code = report.verdict, report.exit_code
    if verdict is Status.PASS:
        warned = _ids(report, Status.WARN)
        return f"PASS: {len(warned)} warn ({', '.join(warned)})" if warned else "PASS"
    if verdict is Status.FAIL:
        failed = _ids(report, Status.FAIL)
        return f"FAIL (exit {code}): {len(failed)} failed: {', '.join(failed)}"
    unmeasured = _ids(report, Status.INCONCLUSIVE)
    why = f"could not measure {', '.join(unmeasured)}" if unmeasured else "no checks ran"
    return f"INCONCLUSIVE (exit {code}): nothing proved safe: {why}"


def waiver_lines(report: Report) -> list[str]:
    return [f"{w.check_id}: {w.reason}" for w in report.waivers]


def output_width(stream: IO[str], environ: Mapping[str, str] = os.environ) -> int | None:
    """The width to fit: COLUMNS when set (a terminal, or a caller that says so), else the
    terminal's own width; None (never cut or wrapped) for a pipe or a file."""
    columns = environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= 40:
        return int(columns)
    isatty = getattr(stream, "isatty", None)
    if isatty and isatty():
        import shutil

        return shutil.get_terminal_size().columns
    return None


_SGR = re.compile("\x1b\\[[0-9;]*m")  # the colour codes the table writes (values' own are escaped)


def strip_colour(text: str) -> str:
    return _SGR.sub("", text)


def visible_len(text: str) -> int:
    """Columns `text` takes on a terminal: its colour codes take none."""
    return len(strip_colour(text))


def fit(text: str, width: int | None) -> str:
    """Every line no wider than `width` (measured without colour codes): long lines wrap under
    their own indentation (nothing is cut; the full text stays in JSON and Markdown)."""
    if not width:
        return text
    out = []
    for line in text.split("\n"):
        if visible_len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out += wrap(line, width, indent=indent + "  ")
    return "\n".join(out)


CONTINUED = "\\"  # ends each piece of a word cut across lines (no URL holds one: a cut address never reads as two)


def wrap(line: str, width: int, *, indent: str = "") -> list[str]:
    """One line in pieces no wider than `width`, broken at spaces, later pieces under `indent`. A
    word longer than a piece (a URL, a path) starts a piece of its own and is cut, each cut piece
    ending with CONTINUED."""
    import textwrap

    width = max(width, len(CONTINUED) + 1)
    cut = width - len(CONTINUED)
    under = indent if cut - len(indent) >= 10 else ""  # a cut word always moves on
    pieces: list[str] = []
    for piece in textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                               break_on_hyphens=False) or [""]:
        while len(piece) > width:
            pieces.append(piece[:cut] + CONTINUED)
            piece = under + piece[cut:]
        pieces.append(piece)
    return pieces


# A message in the table or the Markdown summary: at most this many lines (wrapped at the width
# it is shown at); the rest is in the JSON report, whose `message` stays whole (as SARIF's, JUnit's
# and the annotations' do): a pipeline reads one complete field, and no consumer joins two.
MESSAGE_LINES = 3
MARKDOWN_WIDTH = 100  # the message column a PR comment or step summary gives, for MESSAGE_LINES
SHORTENED_NOTE = "… marks a message cut short here; --format json has every message whole."


def wrapped_lines(text: str, width: int) -> int:
    """Lines `text` takes wrapped at `width`, as the table wraps a cell."""
    return sum(len(wrap(line, width)) for line in text.split("\n"))


def clauses(text: str) -> list[str]:
    """The findings a message joins with "; " (not those inside brackets)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}" and depth > 0
        if depth == 0 and text.startswith("; ", i):
            parts.append(text[start:i])
            start = i + 2
    return [*parts, text[start:]]


def _cut(text: str, fits: Callable[[str], bool]) -> str:
    """`text`, or its longest run of leading words, ending in "…", that `fits`."""
    if fits(text):
        return text
    words = text.split(" ")
    lo, hi = 0, len(words) - 1  # words[:lo] + "…" fits; words[:hi + 1] + "…" does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(" ".join(words[:mid]) + "…"):
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + "…"


def brief(message: str, width: int | None, lines: int = MESSAGE_LINES) -> str:
    """The message as the table and Markdown show it: whole when it takes at most `lines` lines at
    `width` (None: never shortened); else its leading findings (the "; "-joined clauses) that fit,
    "…" for the ones left out, and its fix ("fix: ...", always kept, last)."""
    if not width or wrapped_lines(message, width) <= lines:
        return message
    parts = clauses(" ".join(message.split()))
    fixes = [i for i, part in enumerate(parts) if part.startswith("fix: ")]
    fix = parts[fixes[-1]] if fixes else ""
    findings = [part for i, part in enumerate(parts) if not fixes or i != fixes[-1]] or [""]

    def shown(head: str, fix_text: str = fix) -> str:
        return "; ".join(text for text in (head, fix_text) if text)

    def fits(text: str) -> bool:
        return wrapped_lines(text, width) <= lines

    best = ""
    for n in range(1, len(findings) + 1):
        head = "; ".join(findings[:n]) + ("; …" if n < len(findings) else "")
        if not fits(shown(head)):
            break
        best = head
    if best:
        return shown(best)
    head = _cut(findings[0], lambda h: fits(shown(h)))
    one_line = _cut(findings[0], lambda h: wrapped_lines(h, width) <= 1)
    if not fix or len(head) >= len(one_line):
        return shown(head)
    # The first finding's first line, and as much of the fix as the other lines hold.
    return shown(one_line, _cut(fix, lambda f: fits(shown(one_line, f))))


def colour_wanted(stream: IO[str], environ: Mapping[str, str] = os.environ) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set or TERM=dumb."""
    if "NO_COLOR" in environ or environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
