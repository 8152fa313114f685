"""`kvpreflight advisories list|show`: the advisory feed `check` and `review` match engines against."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvpreflight._internal.commands import options

if TYPE_CHECKING:
    from kvpreflight._internal.checks.advisory_data import Advisory


class AdvisoriesFormat(str, enum.Enum):
    table = "table"
    json = "json"


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The known engine bugs and risky settings that `check` and `review` look for.",
                        no_args_is_help=True)

    @group.command("list")
    def list_command(
        # The engines advisories name, not the engine kinds check talks to; --format: a list, not a report.
        engine: str | None = typer.Option(None, "--engine", help="Only this engine: sglang, vllm, llamacpp, tgi, trtllm, builtin."),
        format: AdvisoriesFormat = typer.Option(AdvisoriesFormat.table, "--format", help="table or json."),
        advisories: list[Path] | None = options.in_panel(options.ADVISORIES, None),
    ) -> None:
        """One line per advisory: id, engine, affected and fixed versions, severity, title."""
        import json
        import sys

        from kvpreflight._internal.checks.advisory_data import ENGINES, load_advisories
        from kvpreflight.errors import ConfigError

        if engine is not None and engine not in ENGINES:
            raise ConfigError(f"--engine {engine!r}: use one of {', '.join(ENGINES)}")
        found = [a for a in load_advisories(tuple(advisories or ())) if engine is None or a.engine == engine]
        if format is AdvisoriesFormat.json:
            sys.stdout.write(json.dumps([a.as_dict() for a in found], indent=2) + "\n")
        else:
            from kvpreflight.formats._common import output_width

            sys.stdout.write(render_table(found, output_width(sys.stdout)))

    @group.command("show")
    def show_command(
        advisory_id: str = typer.Argument(..., metavar="ID", help="An advisory id, e.g. KVPF-SGLANG-2026-001."),
        advisories: list[Path] | None = options.in_panel(options.ADVISORIES, None),
    ) -> None:
        """Everything about one advisory: conditions, sources, how check and review see it, how it was verified."""
        import sys

        from kvpreflight._internal.checks.advisory_data import find_advisory, load_advisories

        sys.stdout.write(render_one(find_advisory(load_advisories(tuple(advisories or ())), advisory_id)))

    app.add_typer(group, name="advisories")


def render_table(found: Sequence[Advisory], width: int | None = None) -> str:
    """One row per advisory; with a width (a terminal, or COLUMNS) the title wraps to fit it."""
    from tabulate import tabulate

    rows = [[a.id, a.engine, a.versions, a.fixed, a.severity.value, "yes" if a.verified else "no", a.title]
            for a in found]
    headers = ["id", "engine", "affected", "fixed", "severity", "verified", "title"]
    count = f"\n{len(found)} advisories\n"
    if width and rows:
        # tabulate's "simple" layout pads each header by 2 and puts 2 spaces between columns.
        used = sum(max(len(h) + 2, *(len(str(r[i])) for r in rows)) + 2 for i, h in enumerate(headers[:-1]))
        if width - used < MIN_TITLE_WIDTH:  # too narrow for a table: the facts on one line, the title under them
            from kvpreflight.formats._common import fit

            lines = [f"{a.id}  {a.engine} {a.versions}, fixed {a.fixed}, {a.severity.value}, "
                     f"{'verified' if a.verified else 'not verified'}\n  {a.title}" for a in found]
            return fit("\n".join(lines), width) + count
        return tabulate(rows, headers=headers, disable_numparse=True,
                        maxcolwidths=[None] * (len(headers) - 1) + [width - used]) + count
    return tabulate(rows, headers=headers, disable_numparse=True) + count


MIN_TITLE_WIDTH = 30


def render_one(a: Advisory) -> str:
    when = []
    if a.pd is not None:
        when.append("prefill/decode deployments" if a.pd else "unified (non-PD) deployments")
    for c in a.settings:
        test = (f"one of {', '.join(c.values)}" if c.values else f"contains {c.contains!r}" if c.contains
                else "set to any value")
        when.append(f"setting {c.name} {test}" + (f" (default {c.default})" if c.default else ""))
    lines = [
        f"{a.id}  [{a.severity.value}]  {a.engine}",
        a.title,
        "",
        f"affected:     {a.versions}",
        f"fixed:        {a.fixed}",
        f"verified:     {'yes' if a.verified else 'no'}",
        f"applies when: {'; '.join(when) or 'always (version only)'}",
        f"fix:          {a.fix}",
        f"check sees:   {a.detect_check or '- (not visible on a running engine)'}",
        f"review sees:  {a.detect_review or '- (not visible in deployment files)'}",
        f"verification: {a.verification}",
        "references:",
        *(f"  {r}" for r in a.references),
        f"source:       {a.source}",
    ]
    return "\n".join(lines) + "\n"
