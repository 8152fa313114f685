"""Output formats. One module per format; `FORMATS` maps the --format name to its module path."""

from __future__ import annotations

import copy
import importlib
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from kvpreflight.formats.interface import FormatError, ReportFormat

if TYPE_CHECKING:
    from kvpreflight.model import Report

FORMATS = {
    "table": "kvpreflight.formats.table:TableFormat",
    "json": "kvpreflight.formats.json:JsonFormat",
    "junit": "kvpreflight.formats.junit:JunitFormat",
    "sarif": "kvpreflight.formats.sarif:SarifFormat",
    "github": "kvpreflight.formats.github:GithubFormat",
    "markdown": "kvpreflight.formats.markdown:MarkdownFormat",
    "prometheus": "kvpreflight.formats.prometheus:PrometheusFormat",
}


def get_format(name: str) -> ReportFormat:
    """The report format registered as `name` (FormatError naming the choices for another name)."""
    try:
        module_name, _, cls = FORMATS[name].partition(":")
    except KeyError:
        raise FormatError(f"unknown --format {name!r}; choose one of: {', '.join(FORMATS)}") from None
    return getattr(importlib.import_module(module_name), cls)()


def write_report(report: Report, fmt: str | ReportFormat, output: Path | None = None, *,
                 secrets: Iterable[str] = ()) -> str:
    """Render `report`, redacted of `secrets` (and of URL credentials), and write it to `output`, or
    to stdout when output is None; returns the text. A table written to a file carries no colour.
    """
    from kvpreflight._internal.redact import redact_report  # here: `--help` reads FORMATS and nothing more

    formatter = get_format(fmt) if isinstance(fmt, str) else fmt
    if output is not None and getattr(formatter, "color", False) is None:
        # Only colour-aware formats (color is None: decide at render) have a colour to turn off;
        # a copy keeps the rest of the caller's settings (quiet).
        formatter = copy.copy(formatter)
        formatter.color = False  # type: ignore[attr-defined]
    return write_text(formatter.render(redact_report(report, secrets)), output)


def write_text(text: str, output: Path | None = None) -> str:
    """`text` to stdout (output None) or to the file `output`, written atomically (parent folders
    created; a reader never sees half a report)."""
    from kvpreflight._internal.files import write_atomic

    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return text
    try:
        write_atomic(output, text)
    except OSError as exc:
        raise FormatError(f"cannot write the report to {output}: {exc.strerror or exc}") from exc
    return text


__all__ = ["FORMATS", "FormatError", "ReportFormat", "get_format", "write_report", "write_text"]
