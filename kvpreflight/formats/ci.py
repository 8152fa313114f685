"""Side effects of running under GitHub Actions, beside whatever --format went to stdout.

When `GITHUB_ACTIONS=true`: the `::error`/`::warning` annotations go to stderr (the runner reads
workflow commands from either stream) and the Markdown summary is appended to the file named by
`$GITHUB_STEP_SUMMARY`, after whatever earlier steps wrote there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import IO

from kvpreflight._internal.files import append_text
from kvpreflight.formats import github
from kvpreflight.formats.markdown import MarkdownFormat
from kvpreflight.model import Report


def github_actions_side_effects(
    report: Report,
    environ: Mapping[str, str] = os.environ,
    *,
    stderr: IO[str] | None = None,
    format_name: str | None = None,
) -> bool:
    """Annotate and summarise under GitHub Actions; returns whether it ran (False elsewhere).

    format_name: the --format written to stdout (not to --output); with "github" the annotations are there
    already and are not written twice (GitHub would show each one twice).
    A step summary that cannot be written is reported as a warning annotation, not raised: the
    verdict and exit code of the run stay those of the checks.
    """
    if environ.get("GITHUB_ACTIONS") != "true":
        return False
    stderr = stderr if stderr is not None else sys.stderr
    lines = [] if format_name == "github" else github.annotation_lines(report)
    summary_path = environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        try:
            append_text(summary_path, "\n" + MarkdownFormat().render(report))
        except OSError as exc:
            reason = f"cannot append the step summary to {summary_path}: {exc.strerror or exc}"
            lines.append(github.command("warning", reason, title="kvpreflight"))
    if lines:
        stderr.write("\n".join(lines) + "\n")
        stderr.flush()
    return True
