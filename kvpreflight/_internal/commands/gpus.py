"""`kvpreflight gpus`: what GPUs this machine has, and which processes hold them."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from kvpreflight._internal.gpus import GpuInventory


class GpusFormat(str, enum.Enum):
    table = "table"
    json = "json"


def register(app: typer.Typer) -> None:
    @app.command("gpus")
    def gpus_command(
        # A list of GPUs, not a report: not check's --format.
        format: GpusFormat = typer.Option(GpusFormat.table, "--format", help="table or json."),
    ) -> None:
        """List the NVIDIA GPUs (name, UUID, memory, driver) and the PIDs on each.

        Without a driver, says so and exits 0: that is information, not an error.
        """
        import json
        import sys

        from kvpreflight._internal.gpus import inventory

        found = inventory()
        if format is GpusFormat.json:
            sys.stdout.write(json.dumps(found.as_dict(), indent=2) + "\n")
        else:
            sys.stdout.write(render_table(found))
        for note in found.notes:
            sys.stderr.write(f"kvpreflight: note: {note}\n")


def render_table(found: GpuInventory) -> str:
    from tabulate import tabulate

    if not found.gpus:
        return f"No GPUs found ({found.reason or 'NVML reports 0 devices'}).\n"
    rows = []
    for gpu in found.gpus:
        pids = ", ".join(str(p.pid) for p in gpu.processes) or "-"
        rows.append([gpu.index, gpu.name or "?", gpu.uuid or "?", _gib(gpu.memory_used_bytes),
                     _gib(gpu.memory_total_bytes), pids])
    table = tabulate(rows, headers=["#", "name", "uuid", "used GiB", "total GiB", "PIDs"], disable_numparse=True)
    return f"{table}\nNVIDIA driver {found.driver_version or 'unknown'}\n"


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f}"
