"""The CLI in-process, as the unit tier runs it: the same typer app and the same error mapping as
the console script (`kvpreflight._internal.commands._run.run_app`), without starting a Python process.

`invoke(...)` returns a `subprocess.CompletedProcess` so a test reads it exactly as it would read
the console script's result; the process-level guarantees (the console script itself, no torch at
`--help`) are tested in the builtin tier (tests/builtin/test_console_script.py)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None, env_exact: Mapping[str, str] | None,
                 cwd: Path | str | None) -> Iterator[None]:
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        if env_exact is not None:
            os.environ.clear()
            os.environ.update({k: str(v) for k, v in env_exact.items()})
        if env is not None:
            os.environ.update({k: str(v) for k, v in env.items()})
        if cwd is not None:
            os.chdir(cwd)
        with _help_width(os.environ.get("TERMINAL_WIDTH")):
            yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _help_width(width: str | None) -> Iterator[None]:
    """typer reads TERMINAL_WIDTH once, when rich_utils is first imported: in one process the first
    test's width would hold for every later one, so each call sets it as a new process would."""
    import typer.rich_utils as rich_utils

    saved = rich_utils.MAX_WIDTH
    rich_utils.MAX_WIDTH = int(width) if width and width.isdigit() else None
    try:
        yield
    finally:
        rich_utils.MAX_WIDTH = saved


def invoke(*args: object, env: Mapping[str, str] | None = None, env_exact: Mapping[str, str] | None = None,
           cwd: Path | str | None = None, stdin: str = "",
           check_ok: bool = False) -> subprocess.CompletedProcess:
    """`kvpreflight ARGS` in this process: exit code, stdout and stderr as the console script gives
    them (an unexpected exception prints its traceback and exits 1, as Python would). `env` adds
    to this process's environment for the call, `env_exact` replaces it; `check_ok` raises
    CalledProcessError on a non-zero exit, as subprocess.run(check=True)."""
    from kvpreflight._internal.cli import app
    from kvpreflight._internal.commands._run import run_app

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with _environment(env, env_exact, cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            _stdin(stdin):
        try:
            code = run_app(app, argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                err.write(exc.code + "\n")
        except Exception:  # what the console script would print: a traceback (a defect a test should see)
            traceback.print_exc(file=err)
            code = 1
    result = subprocess.CompletedProcess(["kvpreflight", *argv], code, out.getvalue(), err.getvalue())
    if check_ok:
        result.check_returncode()
    return result


@contextlib.contextmanager
def _stdin(text: str) -> Iterator[None]:
    saved = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = saved


def command_paths() -> list[tuple[str, ...]]:
    """Every command and subcommand of the app, as the words that name it (() is the root)."""
    import typer

    from kvpreflight._internal.cli import app

    def walk(command: object, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        subs = getattr(command, "commands", {})  # a group (typer may bring its own click)
        return [path] + [p for name, sub in subs.items() for p in walk(sub, (*path, name))]

    return walk(typer.main.get_command(app), ())
