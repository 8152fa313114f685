"""`kvpreflight engine serve`: run one role of the builtin engine (unified, prefill, decode, router).

Only typer and the stdlib are imported here; torch is imported inside the engine process.
"""

from __future__ import annotations

import os
import shlex
import sys

import typer

from kvpreflight._internal.builtin_engine.config import Fault
from kvpreflight.model import ProcessRole

engine_app = typer.Typer(help="The builtin engine: a small SGLang-compatible engine with fault injection.", no_args_is_help=True)


FAULT_NAMES = ", ".join(f.value for f in Fault)

def _strip_fault_args(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--fault":
            skip = True
            continue
        if arg.startswith("--fault="):
            continue
        out.append(arg)
    return out


@engine_app.command("serve")
def serve(
    role: str = typer.Option("unified", "--role", help=", ".join(r.value for r in ProcessRole) + "."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(30000, "--port"),
    # The length this engine serves, not check's promise to users.
    context_length: int | None = typer.Option(None, "--context-length",
        help="Served context length in tokens. Required for unified, prefill and decode."),
    pool_tokens: int | None = typer.Option(None, "--pool-tokens",
        help="KV pool size in tokens (like SGLang --max-total-tokens). Required for unified, prefill and decode, unless "
             "--mem-budget-bytes with --mem-fraction-static."),
    mem_budget_bytes: int | None = typer.Option(None, "--mem-budget-bytes",
        help="Memory the engine may use; with --mem-fraction-static sizes the pool as SGLang does."),
    mem_fraction_static: float | None = typer.Option(None, "--mem-fraction-static"),
    page_size: int = typer.Option(16, "--page-size"),
    model_name: str = typer.Option("kvpreflight-builtin-copy", "--model-name"),
    fault: list[str] | None = typer.Option(None, "--fault",
        help=f"Inject a fault (repeatable): {FAULT_NAMES}. Moved to the environment before the engine starts, so nothing the engine "
             "exposes shows it."),
    transfer_delay_ms: int = typer.Option(0, "--transfer-delay-ms", help="Test only: sleep before each KV page batch is sent."),
    transfer_fail_every: int = typer.Option(0, "--transfer-fail-every",
        help="Test only: every Nth KV transfer loses its pages after the first batch."),
    page_log: str | None = typer.Option(None, "--page-log", help="Debug: JSON lines of pages given, freed and written by transfers."),
    decode_url: str | None = typer.Option(None, "--decode-url", metavar="URL",
        help="router: the decode engine. Required for --role router."),
    prefill_url: list[str] | None = typer.Option(None, "--prefill-url", metavar="URL",
        help="router: a prefill engine (repeatable). Required for --role router."),
    bootstrap_port: int = typer.Option(0, "--disaggregation-bootstrap-port",
        help="prefill: TCP port of its bootstrap server, where decode engines take the KV (0 picks one; see /server_info)."),
    enable_metrics: bool = typer.Option(False, "--enable-metrics"),
    disable_radix_cache: bool = typer.Option(False, "--disable-radix-cache", help="Turn the prefix cache off."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda or auto."),
    kv_canary: str = typer.Option("none", "--kv-canary",
        help="none, log or raise: check each prompt slot's KV before decoding and log a violation (raise: fail the request), as "
             "SGLang's --kv-canary."),
    prefill_tokens_per_second: float = typer.Option(0.0, "--prefill-tokens-per-second",
        help="Test only: prefill no faster than this many tokens per second, like a slow accelerator (0: unthrottled)."),
) -> None:
    """Serve one role of the builtin engine until killed."""
    from kvpreflight._internal.builtin_engine.config import (
        ATTENTION_WINDOW_ENV,
        FAULTS_ENV,
        POSITIONS_ENV,
        EngineConfig,
        fault_probability_from_env,
        faults_from_env,
        parallel_size_from_env,
        parse_faults,
        parse_role,
        pd_wait_from_env,
        tokens_from_env,
    )

    if fault:
        # Re-exec without --fault in argv: faults travel in the environment only.
        wanted = parse_faults(fault, "--fault")  # an unknown name fails here, before anything starts
        merged = ",".join(sorted(f.value for f in faults_from_env() | wanted))
        env = dict(os.environ, **{FAULTS_ENV: merged})
        args = _strip_fault_args(sys.argv[1:])
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "kvpreflight", *args], env)
    engine_role = parse_role(role)
    config = EngineConfig(
        role=engine_role,
        host=host,
        port=port,
        context_length=context_length,
        pool_tokens=pool_tokens,
        mem_budget_bytes=mem_budget_bytes,
        mem_fraction_static=mem_fraction_static,
        page_size=page_size,
        model_name=model_name,
        faults=faults_from_env(),
        fault_probability=fault_probability_from_env(),
        parallel_size=parallel_size_from_env(),
        transfer_delay_ms=transfer_delay_ms,
        transfer_fail_every=transfer_fail_every,
        page_log=page_log,
        decode_url=decode_url,
        prefill_urls=tuple(prefill_url or ()),
        enable_metrics=enable_metrics,
        device=device,
        launch_command=shlex.join(["kvpreflight", *sys.argv[1:]]),
        bootstrap_port=bootstrap_port,
        disable_radix_cache=disable_radix_cache,
        prefill_tokens_per_second=prefill_tokens_per_second,
        pd_wait_s=pd_wait_from_env(engine_role),
        kv_canary=kv_canary,
        positions=tokens_from_env(POSITIONS_ENV),
        attention_window=tokens_from_env(ATTENTION_WINDOW_ENV),
    )
    from kvpreflight._internal.builtin_engine.startup import serve as serve_engine

    raise typer.Exit(serve_engine(config))


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
