"""Runs the typer app and turns kvpreflight's exceptions into one-line errors and exit codes."""

from __future__ import annotations

import sys

import typer

from kvpreflight.errors import KvpreflightError


def error(message: str) -> None:
    """One line on stderr, no traceback."""
    first = " ".join(str(message).split())
    sys.stderr.write(f"kvpreflight: error: {first}\n")


def run_app(app: typer.Typer, args: list[str] | None = None) -> int:
    # typer (standalone mode) handles its own usage errors (exit 2) and typer.Exit; anything of
    # ours that escapes a command becomes one line and its exit code. `args` None: sys.argv[1:].
    try:
        app(args=args)
    except KvpreflightError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    return 0
