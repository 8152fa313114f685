"""Progress on stderr. In a CI log: one line per step, starting with the time it began at. On a terminal: the same lines,
wrapped to its width, plus a live line under them (the current step, its elapsed time) drawn by
rich, which is imported only then (`--help` and pipes never load it). NO_COLOR is honoured.

    with progress_to_stderr("kvpreflight") as say:
        say("probe boundary-accept: 8,185 tokens (expected about 2 s)")
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from kvpreflight.formats._common import fit, output_width


class _Step:
    """The live line's text: the step and how long it has run, recomputed at every refresh."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.started = time.monotonic()

    def __rich__(self) -> Any:
        from rich.text import Text

        return Text(f"{self.text}  [{time.monotonic() - self.started:.0f} s]")


def write_line(prefix: str, message: str, stream: IO[str] | None = None) -> None:
    """One plain progress line (stderr by default), fitted to the terminal's width."""
    stream = stream or sys.stderr
    stream.write(fit(f"{prefix}: {message}", output_width(stream)) + "\n")
    stream.flush()


@contextlib.contextmanager
def progress_to_stderr(prefix: str, stream: IO[str] | None = None,
                       environ: Mapping[str, str] = os.environ) -> Iterator[Callable[[str], None]]:
    stream = stream or sys.stderr
    live = bool(getattr(stream, "isatty", lambda: False)()) and environ.get("TERM") != "dumb"
    if not live:
        # A CI log has no live line: each step says when it began, so a slow step shows.
        started = time.monotonic()
        yield lambda message: write_line(prefix, f"[{time.monotonic() - started:.1f} s] {message}", stream)
        return
    width = output_width(stream, environ)
    from rich.console import Console

    console = Console(file=stream, no_color="NO_COLOR" in environ, highlight=False, soft_wrap=False)
    status = console.status("", spinner="dots")
    status.start()

    def say(message: str) -> None:
        console.print(fit(f"{prefix}: {message}", width), markup=False, highlight=False)
        status.update(_Step(message))  # type: ignore[arg-type,unused-ignore]  # any renderable; rich types it as str

    try:
        yield say
    finally:
        status.stop()
