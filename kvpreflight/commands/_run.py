"""Runs the typer app and turns kvpreflight's exceptions into one-line errors and exit codes."""

from __future__ import annotations

import sys

import click
import typer

from kvpreflight.errors import KvpreflightError


def error(message: str) -> None:
    """One line on stderr, no traceback."""
    first = " ".join(str(message).split())
    sys.stderr.write(f"kvpreflight: error: {first}\n")


def run_app(app: typer.Typer) -> int:
    try:
        # standalone_mode=False: click returns typer.Exit's code instead of calling sys.exit.
        rv = app(standalone_mode=False)
    except KvpreflightError as exc:
        error(str(exc))
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        error("interrupted")
        return 130
    except click.ClickException as exc:
        # Usage errors: typer/click already formats "Usage: ..." helpfully.
        exc.show()
        return 2
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    return rv if isinstance(rv, int) else 0
