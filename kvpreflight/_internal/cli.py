"""Command-line entry point. Only parses arguments and wires the parts together.

Each command lives in `kvpreflight/_internal/commands/<name>.py` with a `register(app)` function; those
modules import nothing heavy at module level so that `kvpreflight --help` stays fast and never
imports torch or an engine library.
"""

from __future__ import annotations

import importlib
import sys

import typer

from kvpreflight import __version__

app = typer.Typer(
    name="kvpreflight",
    help="Deployment preflight for LLM serving: prove each prefill/decode engine's KV pool holds "
    "the served context, that over-capacity requests are hard-rejected, and emit a signed record.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One line per command module (kvpreflight/_internal/commands/NAME.py, each with register(app)).
COMMAND_MODULES = (
    "check",
    "watch",
    "demo",
    "engine",
    "keygen",
    "verify",
    "review",
    "gpus",
    "fleet",
    "advisories",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kvpreflight {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
) -> None:
    pass


for _name in COMMAND_MODULES:
    importlib.import_module(f"kvpreflight._internal.commands.{_name}").register(app)
importlib.import_module("kvpreflight._internal.commands.helpstyle").install()


def main() -> None:
    from kvpreflight._internal.commands._run import run_app

    sys.exit(run_app(app))
