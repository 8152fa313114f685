"""`kvpreflight fleet`: check every deployment of an inventory, here (bounded threads) or on Ray,
and write one merged report and signed record. Parses arguments and wires the parts; no logic here."""

from __future__ import annotations

from pathlib import Path

import typer

from kvpreflight._internal.commands import options


def register(app: typer.Typer) -> None:
    @app.command("fleet")
    def fleet(
        inventory: Path = typer.Argument(..., help="Fleet inventory (YAML): deployments to attach to or boot, with node selectors."),
        parallel: int | None = typer.Option(None, "--parallel",
            help="Deployments checked at once; deployments that share an engine always run one after another. \\[default: 4; with --ray "
                 "all]"),
        ray: str | None = typer.Option(None, "--ray",
            help="Run on Ray: 'auto' (the cluster this machine belongs to) or the head's ADDRESS. One task per deployment, on its "
                 "node."),
        # Two kinds of output (fleet rows, or every deployment's checks), not check's report formats.
        fmt: str | None = typer.Option(None, "--format",
            help="table|json (fleet rows) or junit|sarif|github|markdown (every deployment's checks)."),
        output: Path | None = options.in_panel(options.OUTPUT, None),
        # One record per deployment beside the fleet's: not check's single record.
        record: Path | None = typer.Option(None, "--record",
            help="Write the fleet record here, and each deployment's record (NAME.dsse.json) beside it."),
        sign_key: str | None = options.in_panel(options.SIGN_KEY, None),
        allow_insecure_key: bool = options.in_panel(options.ALLOW_INSECURE_KEY, None),
        subject: list[str] | None = options.in_panel(options.SUBJECTS, None),
        unsigned: bool = options.in_panel(options.UNSIGNED, None),
        work_dir: Path | None = typer.Option(None, "--work-dir",
            help="Where booted deployments' logs go (on each node), kept afterwards. \\[default: a temporary folder, removed afterwards "
                 "unless --keep]"),
        keep: bool = typer.Option(False, "--keep",
            help="Keep the booted deployments' engine and worker logs (the folder is printed) instead of removing them."),
    ) -> None:
        """Check many deployments at once. Exit 0 all pass, 1 one failed, 2 usage error, 3 one inconclusive (none failed)."""
        import sys

        from kvpreflight.fleet import FleetRequest, execute

        raise typer.Exit(execute(FleetRequest(
            inventory=inventory, parallel=parallel, ray=ray, fmt=fmt, output=output, record=record,
            sign_key=sign_key, allow_insecure_key=allow_insecure_key, subjects=tuple(subject or ()), unsigned=unsigned,
            work_dir=work_dir, keep=keep,
            command_line=tuple(sys.argv),
        )))
