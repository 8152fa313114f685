"""`kvpreflight watch`: keep proving a deployment after its release. Parses arguments, wires
`kvpreflight._internal.watch` (whose `schedule` holds the rules between the options), returns the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kvpreflight._internal.commands import options

WATCH_HELP = ("Watch running engines: every --interval, drift against a signed record, the engines' hazard counters and "
              "danger log lines, and two synthetic tenants' canaries. One JSON line per round on stdout; Prometheus "
              "metrics on --listen.")
WATCH_EXAMPLES = (
    "Examples:\n\n"
    "kvpreflight watch --entry http://router:8000 --record release.dsse.json --key kvpreflight.pub\n\n"
    "kvpreflight watch --endpoint http://engine:30000 --once --listen off\n\n"
    "kvpreflight watch --entry URL --interval 300 --max-tokens-per-hour 20000 --textfile /var/lib/node_exporter\n\n"
    "kvpreflight watch --spec SPEC.yaml --full-every 6h\n\n"
    "kvpreflight watch --inventory fleet.yaml --once"
)


def register(app: typer.Typer) -> None:
    @app.command("watch", epilog=WATCH_EXAMPLES, help=WATCH_HELP)
    def watch(
        endpoints: list[str] | None = options.ENDPOINTS,
        entry: str | None = options.ENTRY,
        entry_api: str = options.ENTRY_API,
        entry_model: str | None = options.ENTRY_MODEL,
        spec: Path | None = typer.Option(None, "--spec", metavar="SPEC.yaml", rich_help_panel="Target",
            help="Watch the running engines this boot spec describes, at the URLs its port numbers fix (nothing is booted)."),
        inventory: Path | None = typer.Option(None, "--inventory", metavar="FLEET.yaml", rich_help_panel="Target",
            help="Watch every attach deployment of this fleet inventory, one after another each round, each under its own name."),
        engine: str = options.ENGINE,
        model: str | None = options.MODEL,
        logs: list[str] | None = options.LOGS,
        api_key_env: str | None = options.API_KEY_ENV,
        api_key_file: Path | None = options.API_KEY_FILE,
        headers: list[str] | None = options.HEADERS,
        secret_headers: list[str] | None = options.SECRET_HEADERS,
        ca_bundle: Path | None = options.CA_BUNDLE,
        client_cert: Path | None = options.CLIENT_CERT,
        client_key: Path | None = options.CLIENT_KEY,
        allow_insecure_key: bool = options.in_panel(options.ALLOW_INSECURE_KEY, "Target"),
        tenant_a_key_env: str | None = options.TENANT_A_KEY_ENV,
        tenant_b_key_env: str | None = options.TENANT_B_KEY_ENV,
        tenant_header: str | None = options.TENANT_HEADER,
        no_canaries: bool = typer.Option(False, "--no-canaries", rich_help_panel="Canaries",
            help="Send no request: drift and hazards only (read-only)."),
        # An input here (the record to match), where check, demo and fleet write one: declared here.
        record: Path | None = typer.Option(None, "--record", metavar="FILE", rich_help_panel="Drift",
            help="The signed release record the deployment must still match (needs --key)."),
        key: Path | None = typer.Option(None, "--key", metavar="PUB", rich_help_panel="Drift",
            help="The public key the --record is signed with."),
        interval: float = typer.Option(60.0, "--interval", metavar="S", rich_help_panel="Rounds", help="Seconds between rounds."),
        once: bool = typer.Option(False, "--once", rich_help_panel="Rounds",
            help="One round, then exit as check does: 0 clean, 1 a finding, 3 not measured (cron, CronJobs)."),
        rounds: int | None = typer.Option(None, "--rounds", metavar="N", rich_help_panel="Rounds",
            help="Stop after N rounds; exit with the last round's code."),
        max_tokens_per_hour: int | None = typer.Option(None, "--max-tokens-per-hour", metavar="N", rich_help_panel="Rounds",
            help="Cap the prompt tokens sent per hour (canaries and full rounds); a round that would go over it sends nothing and "
                 "says so."),
        full_every: str | None = typer.Option(None, "--full-every", metavar="DURATION", rich_help_panel="Rounds",
            help="Seconds, or 30m, 6h, 1d: the first round and then one round this often also sends one near-context request and one "
                 "over-capacity request that must be refused, judged as check judges them."),
        # One read or canary answer, not check's wait for a rejection: its own default (10 s, not 30 s).
        timeout: float = typer.Option(10.0, "--timeout", metavar="S", rich_help_panel="Rounds",
            help="Seconds to wait for one read or one canary answer."),
        listen: str | None = typer.Option(None, "--listen", metavar="HOST:PORT", rich_help_panel="Output",
            help="Serve Prometheus metrics here, or off. \\[default: 127.0.0.1:9478; off with --once]"),
        textfile: Path | None = typer.Option(None, "--textfile", metavar="DIR", rich_help_panel="Output",
            help="Also write the metrics to DIR/kvpreflight-watch-NAME.prom after each round (node_exporter's textfile collector)."),
        name: str | None = options.NAME,
    ) -> None:
        from kvpreflight.check_options import options_from

        args = options_from(locals(), capacity_only=True)  # the parameters are CheckOptions' fields
        from kvpreflight._internal.commands._run import progress
        from kvpreflight._internal.redact import Redactor
        from kvpreflight._internal.watch.budget import BudgetPlan
        from kvpreflight._internal.watch.loop import exit_code, stated_budget, watchers_for
        from kvpreflight._internal.watch.metrics import WatchMetrics
        from kvpreflight._internal.watch.schedule import watch_schedule
        from kvpreflight._internal.watch.service import ServiceOutputs, run_service

        schedule = watch_schedule(targets=bool(endpoints or entry), spec=spec, inventory=inventory, interval=interval,
                                  once=once, rounds=rounds, max_tokens_per_hour=max_tokens_per_hour, full_every=full_every,
                                  canaries=not no_canaries, record=record, key=key, textfile=textfile, listen=listen)
        from kvpreflight._internal.watch.targets import watched_deployments

        plans, fleet_name = watched_deployments(args, spec=spec, inventory=inventory, name=name, with_record=record is not None)
        baseline = None
        if record is not None and key is not None:
            from kvpreflight._internal.watch.drift import load_baseline

            baseline = load_baseline(record, key)
        scrub = Redactor(frozenset().union(*(w.plan.auth.secrets for w in plans))).text

        def say(message: str) -> None:
            progress(scrub(message))

        budget = BudgetPlan(interval_s=schedule.interval_s, max_tokens_per_hour=schedule.max_tokens_per_hour,
                            full_every_s=schedule.full_every_s)
        watchers = watchers_for(plans, budget=budget, baseline=baseline, canaries=not no_canaries, progress=say)
        sending = [w for w in watchers if w.settings.canaries]
        if schedule.full_every_s is not None and sending:
            say("reading the engines once to size the full rounds")
        if sending:
            say(stated_budget(budget, sending).statement())
        else:
            say("no canaries (--no-canaries): reads only, sends no request" if no_canaries
                else "every deployment is capacity_only: reads only, sends no request")
        if baseline is not None:
            say(f"drift against {baseline.source} (signed by keyid {baseline.keyid[:16]}…, {baseline.time}): "
                f"{len(baseline.engines)} engine(s)")
        if inventory is not None:
            say(f"watching {len(plans)} deployment(s) of {inventory}: {', '.join(w.name for w in plans)}")

        def write_line(line: str) -> None:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()  # a round's line is out when the round is, even into a pipe

        names = [w.name for w in plans]
        metrics = WatchMetrics(names[0], deployments=names, name=fleet_name)
        outputs = ServiceOutputs(write_line=write_line, progress=say, scrub=scrub, metrics=metrics, listen=schedule.listen,
                                 textfile=textfile)
        last = run_service(watchers, outputs, interval_s=schedule.interval_s, max_rounds=schedule.max_rounds)
        if schedule.bounded:
            raise typer.Exit(exit_code(last))
        say("stopped")
