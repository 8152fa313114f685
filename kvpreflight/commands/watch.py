"""`kvpreflight watch`: keep proving a deployment after its release. Parses arguments, wires
`kvpreflight.watch`, returns the exit code. No logic here."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kvpreflight.commands.options import ENGINE_HELP

WATCH_EXAMPLES = (
    "Examples:\n\n"
    "kvpreflight watch --entry http://router:8000 --record release.dsse.json --key kvpreflight.pub\n\n"
    "kvpreflight watch --endpoint http://engine:30000 --once --listen off\n\n"
    "kvpreflight watch --entry URL --interval 300 --max-tokens-per-hour 20000 --textfile /var/lib/node_exporter"
)


def register(app: typer.Typer) -> None:
    @app.command("watch", epilog=WATCH_EXAMPLES)
    def watch(
        endpoint: list[str] | None = typer.Option(None, "--endpoint", metavar="URL|ROLE=URL", rich_help_panel="Target", help="Engine URL, or ROLE=URL, as for check. Repeatable."),
        entry: str | None = typer.Option(None, "--entry", metavar="URL", rich_help_panel="Target", help="Client-facing URL (router, gateway) the canaries go to; a router that lists its workers names the engines, so a worker added behind it is seen."),
        engine: str = typer.Option("auto", "--engine", metavar="NAME", rich_help_panel="Target", help=f"The engine kind: {ENGINE_HELP}."),
        model: str | None = typer.Option(None, "--model", metavar="NAME", rich_help_panel="Target", help="Model name the engines serve (and the OpenAI `model` field)."),
        log: list[str] | None = typer.Option(None, "--log", metavar="URL=PATH", rich_help_panel="Target", help="URL=PATH of an engine's or the router's log, followed for danger lines. Repeatable."),
        api_key_env: str | None = typer.Option(None, "--api-key-env", metavar="VAR", rich_help_panel="Target", help="Environment variable holding the API key."),
        api_key_file: Path | None = typer.Option(None, "--api-key-file", metavar="PATH", rich_help_panel="Target", help="File holding the API key."),
        header: list[str] | None = typer.Option(None, "--header", metavar="'NAME: VALUE'", rich_help_panel="Target", help="Extra request header. Repeatable."),
        secret_header: list[str] | None = typer.Option(None, "--secret-header", metavar="NAME", rich_help_panel="Target", help="NAME of a --header whose value is a secret. Repeatable."),
        ca_bundle: Path | None = typer.Option(None, "--ca-bundle", metavar="PATH", rich_help_panel="Target", help="CA bundle for engines behind TLS with a private CA."),
        client_cert: Path | None = typer.Option(None, "--client-cert", metavar="PATH", rich_help_panel="Target", help="Client certificate (PEM) for mutual TLS."),
        client_key: Path | None = typer.Option(None, "--client-key", metavar="PATH", rich_help_panel="Target", help="Private key (PEM) for --client-cert."),
        allow_insecure_key: bool = typer.Option(False, "--allow-insecure-key", rich_help_panel="Target", help="Use a --client-key that others can read."),
        tenant_a_key_env: str | None = typer.Option(None, "--tenant-a-key-env", metavar="VAR", rich_help_panel="Canaries", help="Environment variable holding synthetic tenant A's API key."),
        tenant_b_key_env: str | None = typer.Option(None, "--tenant-b-key-env", metavar="VAR", rich_help_panel="Canaries", help="Environment variable holding synthetic tenant B's API key."),
        tenant_header: str | None = typer.Option(None, "--tenant-header", metavar="NAME", rich_help_panel="Canaries", help="Header NAME the deployment reads the tenant from."),
        no_canaries: bool = typer.Option(False, "--no-canaries", rich_help_panel="Canaries", help="Send no request: drift and hazards only (read-only)."),
        record: Path | None = typer.Option(None, "--record", metavar="FILE", rich_help_panel="Drift", help="The signed release record the deployment must still match (needs --key)."),
        key: Path | None = typer.Option(None, "--key", metavar="PUB", rich_help_panel="Drift", help="The public key the --record is signed with."),
        interval: float = typer.Option(60.0, "--interval", metavar="S", rich_help_panel="Rounds", help="Seconds between rounds."),
        once: bool = typer.Option(False, "--once", rich_help_panel="Rounds", help="One round, then exit as check does: 0 clean, 1 a finding, 3 not measured (cron, CronJobs)."),
        rounds: int | None = typer.Option(None, "--rounds", metavar="N", rich_help_panel="Rounds", help="Stop after N rounds; exit with the last round's code."),
        max_tokens_per_hour: int | None = typer.Option(None, "--max-tokens-per-hour", metavar="N", rich_help_panel="Rounds", help="Cap the canaries' prompt tokens per hour; a round that would go over it sends nothing and says so."),
        timeout: float = typer.Option(10.0, "--timeout", metavar="S", rich_help_panel="Rounds", help="Seconds to wait for one read or one canary answer."),
        listen: str | None = typer.Option(None, "--listen", metavar="HOST:PORT", rich_help_panel="Output", help="Serve Prometheus metrics here, or off. [default: 127.0.0.1:9478; off with --once]"),
        textfile: Path | None = typer.Option(None, "--textfile", metavar="DIR", rich_help_panel="Output", help="Also write the metrics to DIR/kvpreflight-watch-NAME.prom after each round (node_exporter's textfile collector)."),
        name: str | None = typer.Option(None, "--name", metavar="NAME", rich_help_panel="Output", help="The deployment's name: the `deployment` label of every series. [default: the entry URL, else the first endpoint]"),
    ) -> None:
        """Watch running engines: every --interval, drift against a signed record, the engines' hazard counters and danger log lines, and two synthetic tenants' canaries. One JSON line per round on stdout; Prometheus metrics on --listen."""
        from kvpreflight.check_options import CheckOptions, build_plan
        from kvpreflight.commands.check import progress
        from kvpreflight.errors import ConfigError
        from kvpreflight.formats._common import label_url
        from kvpreflight.redact import Redactor
        from kvpreflight.targets import positive
        from kvpreflight.watch.budget import BudgetPlan
        from kvpreflight.watch.loop import Watcher, WatchSettings
        from kvpreflight.watch.metrics import WatchMetrics
        from kvpreflight.watch.service import DEFAULT_LISTEN, ServiceOutputs, parse_listen, run_service

        if not endpoint and not entry:
            raise ConfigError("no --endpoint given; pass the URL of every engine, or --entry ROUTER (a router that lists its workers)")
        for flag, value in (("--interval", interval), ("--rounds", rounds), ("--max-tokens-per-hour", max_tokens_per_hour)):
            try:
                positive(value)
            except ConfigError as exc:
                raise exc.under(flag) from None
        if once and rounds is not None:
            raise ConfigError("--once is --rounds 1; pass one of them")
        if (record is None) != (key is None):
            raise ConfigError("--record FILE and --key PUB go together: the record is only believed once its signature is verified")
        if textfile is not None and not textfile.is_dir():
            raise ConfigError(f"--textfile {textfile}: not a folder")
        try:
            where = parse_listen(listen if listen is not None else ("off" if once else DEFAULT_LISTEN))
        except ConfigError as exc:
            raise exc.under("--listen") from None
        args = CheckOptions(endpoints=tuple(endpoint or ()), entry=entry, engine=engine, model=model, logs=tuple(log or ()),
                         api_key_env=api_key_env, api_key_file=api_key_file, headers=tuple(header or ()),
                         secret_headers=tuple(secret_header or ()), ca_bundle=ca_bundle, client_cert=client_cert,
                         client_key=client_key, allow_insecure_key=allow_insecure_key, capacity_only=True, timeout=timeout,
                         tenant_a_key_env=tenant_a_key_env, tenant_b_key_env=tenant_b_key_env, tenant_header=tenant_header)
        plan = build_plan(args)
        baseline = None
        if record is not None and key is not None:
            from kvpreflight.watch.drift import load_baseline

            baseline = load_baseline(record, key)
        scrub = Redactor(plan.auth.secrets).text

        def say(message: str) -> None:
            progress(scrub(message))

        budget = BudgetPlan(interval_s=interval, max_tokens_per_hour=max_tokens_per_hour)
        say(budget.statement() if not no_canaries else "no canaries (--no-canaries): reads only, sends no request")
        if baseline is not None:
            say(f"drift against {baseline.source} (signed by keyid {baseline.keyid[:16]}…, {baseline.time}): "
                f"{len(baseline.engines)} engine(s)")
        deployment = name or label_url(plan.entry) or label_url(plan.targets[0].url) or "kvpreflight"
        watcher = Watcher(WatchSettings(plan=plan, budget=budget, baseline=baseline, canaries=not no_canaries), progress=say)
        def write_line(line: str) -> None:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()  # a round's line is out when the round is, even into a pipe

        outputs = ServiceOutputs(write_line=write_line,
                                 progress=say, scrub=scrub, metrics=WatchMetrics(deployment), listen=where, textfile=textfile)
        last = run_service(watcher, outputs, interval_s=interval, max_rounds=1 if once else rounds)
        if once or rounds is not None:
            raise typer.Exit(last.exit_code if last is not None else 3)
        say("stopped")
