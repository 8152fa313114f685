"""The output-format interface: render a finished Report to text. Formats never judge."""

from __future__ import annotations

import abc

from kvpreflight.errors import ConfigError
from kvpreflight.model import Report


class FormatError(ConfigError):
    """An output that cannot be written (an unknown format, an unwritable file)."""


class ReportFormat(abc.ABC):
    """One report format: renders a Report as text (`render`); the registry is FORMATS."""
    name: str

    @abc.abstractmethod
    def render(self, report: Report) -> str:
        """The whole report as text (ends with a newline)."""
