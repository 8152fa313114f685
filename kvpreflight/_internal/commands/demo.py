"""`kvpreflight demo`: boot a prefill/decode pair of builtin engines, check it, tear it down."""

from __future__ import annotations

from pathlib import Path

import typer

from kvpreflight._internal.commands import options


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        # The defaults are the library's (builtin_engine.deployment.BuiltinDeployment, demo.DEFAULT_OUT), shown in the help only.
        pool_ratio: float | None = typer.Option(None, "--pool-ratio",
            help="Prefill KV pool = R x served context (0.65 reproduces the incident's 681,280 / 1,048,576). \\[default: 2.0]"),
        decode_pool_ratio: float | None = typer.Option(None, "--decode-pool-ratio",
            help="Decode KV pool = R x served context. \\[default: 2.0]"),
        # The demo engines' served length, not a promise checked against what an engine serves.
        context_length: int | None = typer.Option(None, "--context-length",
            help="Served context length of the demo engines. \\[default: 8192]"),
        fault: list[str] | None = typer.Option(None, "--fault",
            help="Run the engines with this fault (repeatable); see `kvpreflight engine serve --help`."),
        router: str | None = typer.Option(None, "--router",
            help="The PD router in front of the pair: builtin (no dependency), smg (SGLang's Shepherd Model Gateway) or sglang-router "
                 "(both: scripts/setup_engines.sh --only smg). \\[default: builtin]"),
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
        out_dir: Path | None = typer.Option(None, "--out", metavar="DIR",
            help="Where the record and the demo's signing key go (the printed verify command names them); the key is made once and "
                 "reused. \\[default: kvpreflight-demo]"),
        keep: bool = typer.Option(False, "--keep", help="Keep the engines' logs (in DIR/logs) instead of removing them."),
    ) -> None:
        """Boot a builtin prefill/decode deployment, run the full check through its router, write a signed record.

        Exit codes as for `check`: 0 pass, 1 a check failed, 2 usage error, 3 inconclusive.
        """
        import sys

        from kvpreflight._internal.demo import demo_deployment, demo_output, run_demo
        from kvpreflight._internal.terminal import progress_to_stderr

        deployment = demo_deployment(pool_ratio=pool_ratio, decode_pool_ratio=decode_pool_ratio, context_length=context_length,
                                     faults=tuple(fault or ()), incident=incident, router=router)
        out = demo_output(fmt=fmt, output=output, quiet=quiet, record=record, command_line=sys.argv)
        with progress_to_stderr("kvpreflight demo") as show:  # a live line on a terminal, as check draws
            run = run_demo(deployment, out, log_dir=log_dir, sign_key=sign_key, allow_insecure_key=allow_insecure_key,
                           record_path=record, command_line=tuple(sys.argv), progress=show, out_dir=out_dir, keep=keep)
        raise typer.Exit(run.report.exit_code)
