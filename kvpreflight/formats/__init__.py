"""Output formats. One module per format; `FORMATS` maps the --format name to its module path."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

from kvpreflight.formats.interface import FormatError, ReportFormat
from kvpreflight.model import Report

FORMATS = {
    "table": "kvpreflight.formats.table:TableFormat",
    "json": "kvpreflight.formats.json:JsonFormat",
    "junit": "kvpreflight.formats.junit:JunitFormat",
    "sarif": "kvpreflight.formats.sarif:SarifFormat",
    "github": "kvpreflight.formats.github:GithubFormat",
    "markdown": "kvpreflight.formats.markdown:MarkdownFormat",
}


def get_format(name: str) -> ReportFormat:
    try:
        module_name, _, cls = FORMATS[name].partition(":")
    except KeyError:
        raise FormatError(f"unknown --format {name!r}; choose one of: {', '.join(FORMATS)}") from None
    return getattr(importlib.import_module(module_name), cls)()


def write_report(report: Report, fmt: str | ReportFormat, output: Path | None = None) -> str:
    """Render `report` and write it to `output`, or to stdout when output is None; returns the text.

    A file is written atomically (a temporary file beside it, then a rename), its parent folders
    created; a reader never sees half a report. A table written to a file carries no colour.
    """
    formatter = get_format(fmt) if isinstance(fmt, str) else fmt
    if output is not None and getattr(formatter, "color", False) is None:
        formatter = type(formatter)(color=False)  # type: ignore[call-arg]
    text = formatter.render(report)
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return text
    output = Path(output)
    tmp_name = None
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes the file 0600; a report is not a secret: the usual umask-based mode.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, output)
        tmp_name = None
    except OSError as exc:
        raise FormatError(f"cannot write the report to {output}: {exc.strerror or exc}") from exc
    finally:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass
    return text


__all__ = ["FORMATS", "FormatError", "ReportFormat", "get_format", "write_report"]
