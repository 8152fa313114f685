"""`kvpreflight demo`: boot a prefill/decode pair of builtin engines, check it, tear it down."""

from __future__ import annotations

from pathlib import Path

import typer

from kvpreflight.commands import options


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        pool_ratio: float = typer.Option(2.0, "--pool-ratio",
            help="Prefill KV pool = R x served context (0.65 reproduces the incident's 681,280 / 1,048,576)."),
        decode_pool_ratio: float = typer.Option(2.0, "--decode-pool-ratio", help="Decode KV pool = R x served context."),
        # The demo engines' served length, not a promise checked against what an engine serves.
        context_length: int = typer.Option(8192, "--context-length", help="Served context length of the demo engines."),
        fault: list[str] | None = typer.Option(None, "--fault",
            help="Run the engines with this fault (repeatable); see `kvpreflight engine serve --help`."),
        router: str = typer.Option("builtin", "--router",
            help="The PD router in front of the pair: builtin (no dependency), smg (SGLang's Shepherd Model Gateway) or sglang-router "
                 "(both: scripts/setup_engines.sh --only smg)."),
        incident: bool = typer.Option(False, "--incident",
            help="The incident as it happened: pool ratio 0.65, reject-continues and no-transfer-check, another tenant's data in the "
                 "pool."),
        fmt: str | None = options.in_panel(options.FORMAT, None),
        output: Path | None = options.in_panel(options.OUTPUT, None),
        quiet: bool = options.in_panel(options.QUIET, None),
        # --record and --sign-key have defaults of their own here (a record in DIR, a fresh key).
        record: Path | None = typer.Option(None, "--record", help="Where to write the signed record. \\[default: DIR/record.dsse.json]"),
        sign_key: str | None = typer.Option(None, "--sign-key", help="Sign with this key instead of a fresh one."),
        allow_insecure_key: bool = options.in_panel(options.ALLOW_INSECURE_KEY, None),
        log_dir: Path | None = typer.Option(None, "--log-dir",
            help="Where the engines' logs go. \\[default: a temporary folder, removed afterwards]"),
        out_dir: Path = typer.Option(Path("kvpreflight-demo"), "--out", metavar="DIR",
            help="Where the record and the demo's signing key go (the printed verify command names them); the key is made once and "
                 "reused."),
        keep: bool = typer.Option(False, "--keep", help="Keep the engines' logs (in DIR/logs) instead of removing them."),
    ) -> None:
        """Boot a builtin prefill/decode deployment, run the full check through its router, write a signed record.

        Exit codes as for `check`: 0 pass, 1 a check failed, 2 usage error, 3 inconclusive.
        """
        import sys

        from kvpreflight.check_options import build_output
        from kvpreflight.demo import BuiltinDeployment, run_demo
        from kvpreflight.errors import ConfigError
        from kvpreflight.model import RouterKind

        if router not in set(RouterKind):
            raise ConfigError(f"--router: must be one of {', '.join(RouterKind)} (got {router!r})")
        deployment = BuiltinDeployment(
            pool_ratio=pool_ratio, decode_pool_ratio=decode_pool_ratio, context_length=context_length,
            faults=tuple(fault or ()), incident=incident, router=RouterKind(router),
        )
        flags = {"pool_ratio": "--pool-ratio", "decode_pool_ratio": "--decode-pool-ratio",
                 "context_length": "--context-length", "faults": "--fault", "router": "--router"}
        deployment.validate(name_of=lambda field: flags[field.split("[")[0]])  # faults[0] -> --fault
        # The record's key and subjects are the demo's own (a fresh key, its logs); only the format,
        # the report file and the record's path come from here.
        out = build_output(fmt=fmt, output=output, record=None, sign_key=None, subjects=(), unsigned=False,
                           command_line=tuple(sys.argv), reads_files=True, quiet=quiet)
        if record is not None:
            from kvpreflight.files import check_writable

            check_writable(record, "--record")
        from kvpreflight.terminal import progress_to_stderr

        with progress_to_stderr("kvpreflight demo") as show:  # a live line on a terminal, as check draws
            run = run_demo(deployment, out, log_dir=log_dir, sign_key=sign_key, allow_insecure_key=allow_insecure_key,
                           record_path=record,
                           command_line=tuple(sys.argv), progress=show, out_dir=out_dir, keep=keep)
        raise typer.Exit(run.report.exit_code)
