"""The output-format interface: render a finished Report to text. Formats never judge."""

from __future__ import annotations

import abc

from kvpreflight.errors import KvpreflightError
from kvpreflight.model import Report


class FormatError(KvpreflightError):
    exit_code = 2


class ReportFormat(abc.ABC):
    name: str

    @abc.abstractmethod
    def render(self, report: Report) -> str:
        """The whole report as text (ends with a newline)."""
