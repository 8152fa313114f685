"""Runs the typer app and turns kvpreflight's exceptions into one-line errors and exit codes."""

from __future__ import annotations

import sys

import typer

from kvpreflight.errors import KvpreflightError


def error(message: str) -> None:
    """One line on stderr, no traceback."""
    first = " ".join(str(message).split())
    sys.stderr.write(f"kvpreflight: error: {first}\n")


def progress(message: str) -> None:
    """A progress line on stderr, out at once (check and watch)."""
    from kvpreflight._internal.terminal import write_line

    write_line("kvpreflight", message)
    sys.stderr.flush()


def run_app(app: typer.Typer, args: list[str] | None = None) -> int:
    # typer (standalone mode) handles its own usage errors (exit 2) and typer.Exit; anything of
    # ours that escapes a command becomes one line and its exit code. `args` None: sys.argv[1:].
    try:
        app(args=args)
    except KvpreflightError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except SystemExit as exc:
        if exc.code == INTERRUPTED and _caused_by_ctrl_c(exc):  # recent typer turns Ctrl-C into exit 130, silently
            return _interrupted()
        raise
    return 0


INTERRUPTED = 130


def _interrupted() -> int:
    # Every engine or process the run started was stopped by the `finally` blocks the interrupt
    # passed through (kvpreflight.boot) before this line is printed.
    error("interrupted (Ctrl-C): the run stopped and sends nothing more; every engine it started has been stopped")
    return INTERRUPTED


def _caused_by_ctrl_c(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # SystemExit <- typer's Exit <- KeyboardInterrupt
        seen = seen.__cause__ or seen.__context__ if seen is not None else None
        if isinstance(seen, KeyboardInterrupt):
            return True
    return False
