"""The README as a test reads it: its quickstart sample output, and the flags it names."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"
SAMPLE_MARK = "<!-- sample-output:"
STATUSES = ("FAIL", "INCONCLUSIVE", "WARN", "SKIP", "PASS")


def sample_output(text: str | None = None) -> str:
    """The text block right after the sample-output marker."""
    text = README.read_text(encoding="utf-8") if text is None else text
    after = text.split(SAMPLE_MARK, 1)[1]
    return after.split("```text\n", 1)[1].split("\n```", 1)[0]


def _row(line: str) -> tuple[str, str] | None:
    """(STATUS, check id) where a table row starts on this line (its message may wrap onto
    indented lines after it)."""
    words = line.split()
    return (words[0], words[1]) if len(words) >= 2 and words[0] in STATUSES and not line.startswith(" ") else None


def check_rows(report: str) -> list[tuple[str, str]]:
    """(STATUS, check id) per row of a table report, in the order printed."""
    return [row for line in report.splitlines() if (row := _row(line))]


def row_messages(report: str, url: str) -> dict[tuple[str, str], str]:
    """The whole message of every row that is not PASS (a PASS row's is cut to the column), its
    wrapped lines joined, keyed by (STATUS, check id), with the engine URL as URL."""
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("status") and "message" in line)
    column = lines[header].index("message")
    messages: dict[tuple[str, str], str] = {}
    key: tuple[str, str] | None = None
    for line in lines[header + 2:]:
        if not line.strip():
            break
        if row := _row(line):
            key = row if row[0] != "PASS" else None
            if key:
                messages[key] = line[column:].strip()
        elif key:
            messages[key] += " " + line[column:].strip()
    return {k: v.replace(url, "URL") for k, v in messages.items()}


def verdict_line(report: str, url: str) -> str:
    """The last paragraph (the verdict line, however it wrapped), with the engine URL as URL."""
    last = report.strip().split("\n\n")[-1]
    return " ".join(last.split()).replace(url, "URL")


def flags_named(text: str | None = None) -> set[str]:
    """Every --flag the README names in code (a block or `inline`)."""
    text = README.read_text(encoding="utf-8") if text is None else text
    code = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", text))
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", code))
