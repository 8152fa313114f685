"""Output formats. One module per format; `FORMATS` maps the --format name to its module path."""

from __future__ import annotations

import importlib

from kvpreflight.formats.interface import FormatError, ReportFormat

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


__all__ = ["FORMATS", "FormatError", "ReportFormat", "get_format"]
