"""`kvpreflight check`: prove live engines' KV pools hold the served context and that
over-capacity requests are hard-rejected. Parses arguments into a `CheckPlan`, calls
`kvpreflight.preflight`, writes the outputs, returns the exit code. What it decides itself is
which mode runs (attach, --boot, --plan) and where its outputs go; every check is the library's."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvpreflight.commands import options
from kvpreflight.formats import FORMATS
from kvpreflight.probes.results import ScenarioName
from kvpreflight.targets import REQUEST_TIMEOUT_S

if TYPE_CHECKING:
    from kvpreflight.boot.spec import DeploymentSpec
    from kvpreflight.check_plan import CheckPlan
    from kvpreflight.model import Report

FORMAT_HELP = ", ".join(FORMATS)
SCENARIO_HELP = (f"Run only this isolation scenario ({', '.join(s.value for s in ScenarioName)}); repeatable. The others "
                 "are reported as not selected. [default: all]")


CHECK_EXAMPLES = (
    "Examples:\n\n"
    "kvpreflight check --endpoint http://localhost:30000\n\n"
    "kvpreflight check --entry http://router:8000 --context-length 1048576\n\n"
    "kvpreflight check --endpoint URL --plan\n\n"
    "kvpreflight check --endpoint URL --record release.dsse.json --sign-key kvpreflight.key --subject image=sha256:HEX\n\n"
    "kvpreflight check --boot examples/specs/builtin-pd.yaml"
)


def progress(message: str) -> None:
    from kvpreflight.terminal import write_line

    write_line("kvpreflight", message)
    sys.stderr.flush()


def register(app: typer.Typer) -> None:
    @app.command("check", epilog=CHECK_EXAMPLES)
    def check(
        endpoints: list[str] | None = options.ENDPOINTS,
        entry_api: str = options.ENTRY_API,
        entry_model: str | None = options.ENTRY_MODEL,
        entry: str | None = options.ENTRY,
        engine: str = options.ENGINE,
        model: str | None = options.MODEL,
        context_length: int | None = typer.Option(None, "--context-length", metavar="N", rich_help_panel="Target", help="Context length promised to users; the larger of it and what the engine serves is checked. [default: what the engine serves]"),
        logs: list[str] | None = options.LOGS,
        api_key_env: str | None = options.API_KEY_ENV,
        api_key_file: Path | None = options.API_KEY_FILE,
        headers: list[str] | None = options.HEADERS,
        secret_headers: list[str] | None = options.SECRET_HEADERS,
        ca_bundle: Path | None = options.CA_BUNDLE,
        client_cert: Path | None = options.CLIENT_CERT,
        client_key: Path | None = options.CLIENT_KEY,
        capacity_only: bool = typer.Option(False, "--capacity-only", rich_help_panel="Probes", help="Read-only: send no request (production endpoints under a change freeze)."),
        tenant_a_key_env: str | None = options.TENANT_A_KEY_ENV,
        tenant_b_key_env: str | None = options.TENANT_B_KEY_ENV,
        tenant_header: str | None = options.TENANT_HEADER,
        allow_disruptive: bool = typer.Option(False, "--allow-disruptive", rich_help_panel="Isolation", help="Also run the isolation scenarios that churn the engine (client disconnects, load near the pool) against a live deployment."),
        scenarios: list[str] | None = typer.Option(None, "--scenario", metavar="NAME", rich_help_panel="Isolation", help=SCENARIO_HELP),
        skips: list[str] | None = typer.Option(None, "--skip", metavar="CHECK_ID", rich_help_panel="Probes", help="Waive a check id; needs a matching --reason. Repeatable."),
        reasons: list[str] | None = typer.Option(None, "--reason", metavar="TEXT", rich_help_panel="Probes", help="Why the matching --skip is waived (kept in the report and record)."),
        untils: list[str] | None = typer.Option(None, "--until", metavar="YYYY-MM-DD", rich_help_panel="Probes", help="YYYY-MM-DD: the matching --skip's last day; `verify` refuses a record whose waiver expired."),
        fmt: str | None = typer.Option(None, "--format", metavar="FORMAT", rich_help_panel="Output", help=f"One of: {FORMAT_HELP}. [default: table]"),
        output: Path | None = typer.Option(None, "--output", metavar="PATH", rich_help_panel="Output", help="Write the report here instead of stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", rich_help_panel="Output", help="Leave the passing checks out of the table (the verdict line still counts them)."),
        name: str | None = typer.Option(None, "--name", metavar="NAME", rich_help_panel="Output", help="The deployment's name in the report: the `deployment` label of every Prometheus series and SARIF's per-deployment path. [default: the entry URL, else the first endpoint]"),
        timeout: float = typer.Option(REQUEST_TIMEOUT_S, "--timeout", metavar="S", rich_help_panel="Budgets", help="Seconds to wait for a rejection or a short request; accepted long prompts get more, from the engine's measured speed."),
        plan_only: bool = typer.Option(False, "--plan", rich_help_panel="Budgets", help="Print the probes it would send, their sizes, context-equivalents and expected duration; sends only one short calibration request per entry (the duration is then an upper estimate)."),
        no_calibrate: bool = typer.Option(False, "--no-calibrate", rich_help_panel="Budgets", help="With --plan: send no request at all (the duration is then unknown)."),
        max_context_equivalents: float | None = typer.Option(None, "--max-context-equivalents", metavar="N", rich_help_panel="Budgets", help="Refuse (exit 2, before any request) a plan that submits more prompt tokens than N times the context."),
        deadline: float | None = typer.Option(None, "--deadline", metavar="S", rich_help_panel="Budgets", help="Seconds the whole check may take; past it, exit 3 naming the stage. [default: 3x the estimate printed after calibration, plus room for waits]"),
        concurrency: int | None = typer.Option(None, "--concurrency", metavar="N", rich_help_panel="Probes", help="Near-limit requests sent at once by concurrent-capacity. [default: from checks/thresholds.yaml]"),
        timing_samples: int | None = typer.Option(None, "--timing-samples", metavar="N", rich_help_panel="Isolation", help="Requests per kind (cold, same-tenant warm, cross-tenant) of the prefix-cache timing audit, sent only where the engine reports no cache hits. [default: 30]"),
        accepted_tokens_per_second: float | None = typer.Option(None, "--accepted-tokens-per-second", metavar="N", rich_help_panel="Budgets", help="Assumed prompt speed for budgets only when the engine's speed could not be measured."),
        advisories: list[Path] | None = typer.Option(None, "--advisories", metavar="DIR", rich_help_panel="Probes", help="Extra folder of advisory YAML files. Repeatable."),
        record: Path | None = typer.Option(None, "--record", metavar="PATH", rich_help_panel="Record", help="Write a signed release record (DSSE, in-toto) of this run here, pass or fail."),
        sign_key: str | None = typer.Option(None, "--sign-key", metavar="PATH", rich_help_panel="Record", help="Private key file for --record (or set KVPREFLIGHT_SIGN_KEY to its path)."),
        allow_insecure_key: bool = typer.Option(False, "--allow-insecure-key", rich_help_panel="Record", help="Use a private key (--sign-key, --client-key) that others can read (by default refused, as ssh refuses one: chmod 600 it)."),
        subject: list[str] | None = typer.Option(None, "--subject", metavar="NAME=sha256:HEX", rich_help_panel="Record", help="NAME=sha256:HEX the record is about (image, config, model revision). Repeatable."),
        unsigned: bool = typer.Option(False, "--unsigned", rich_help_panel="Record", help="Write the record unsigned (verify will refuse it)."),
        test_result: Path | None = typer.Option(None, "--test-result", metavar="PATH", rich_help_panel="Record", help="With --record: also write an in-toto Test Result (DSSE, same key and subjects) here."),
        boot: Path | None = typer.Option(None, "--boot", metavar="SPEC.yaml", rich_help_panel="Boot", help="Boot the deployment in this spec (YAML), check it, stop everything."),
        keep: bool = typer.Option(False, "--keep", rich_help_panel="Boot", help="With --boot and no --log-dir: keep the engines' logs (the folder is printed) instead of removing them."),
        log_dir: Path | None = typer.Option(None, "--log-dir", metavar="DIR", rich_help_panel="Boot", help="With --boot: where engine logs go. [default: a temporary folder, removed afterwards unless --keep]"),
    ) -> None:
        """Check running engines (or boot them from a spec with --boot). Exit 0 pass, 1 a check failed, 2 usage error, 3 inconclusive."""
        from kvpreflight.check_options import options_from

        args = options_from(locals())  # the parameters are CheckOptions' fields
        from kvpreflight import preflight
        from kvpreflight.check_options import build_output, build_plan
        from kvpreflight.errors import ConfigError

        # Everything is validated here, before any engine is contacted or booted.
        spec = None
        if boot is not None:
            if endpoints or entry or logs:
                raise ConfigError("--boot takes its engines, entry and logs from the spec; drop --endpoint, --entry and --log")
            from kvpreflight.boot import load_spec

            spec = load_spec(boot)
            spec.check_client_certificate()
            spec.check_client_key_private(allow_insecure=allow_insecure_key)
        elif log_dir is not None or keep:
            raise ConfigError(f"{'--log-dir' if log_dir is not None else '--keep'} only makes sense with --boot SPEC.yaml")
        elif not endpoints and not entry:
            raise ConfigError("no --endpoint given; pass the URL of every prefill, decode or unified engine, "
                              "--entry ROUTER (a router that lists its workers), or --boot SPEC.yaml")
        plan = build_plan(args, booted=spec is not None)
        if no_calibrate and not plan_only:
            raise ConfigError("--no-calibrate only makes sense with --plan")
        if plan_only:
            _print_plan(plan, spec, measure=not no_calibrate, fmt=fmt, output=output, unwanted=(record, subject, unsigned, test_result))
            return
        out = build_output(fmt=fmt, output=output, record=record, sign_key=sign_key, subjects=tuple(subject or ()),
                           unsigned=unsigned, command_line=tuple(sys.argv), reads_files=bool(plan.logs) or spec is not None,
                           test_result=test_result, advisory_dirs=plan.advisory_dirs, spec=boot, name=name, quiet=quiet,
                           allow_insecure_key=allow_insecure_key)
        preflight.validate(plan)
        from kvpreflight.errors import KvpreflightError
        from kvpreflight.redact import Redactor
        from kvpreflight.terminal import progress_to_stderr

        scrub = Redactor(plan.auth.secrets).text

        def say(message: str) -> None:
            progress(scrub(message))

        import shutil
        import tempfile

        # Boot mode without --log-dir: the logs go to a temporary folder, removed once the record
        # (which names them by digest) is written, unless --keep.
        temporary = Path(tempfile.mkdtemp(prefix="kvpreflight-boot-")) if spec is not None and log_dir is None else None
        try:
            with progress_to_stderr("kvpreflight") as show:  # a live line on a terminal, plain lines in CI
                try:
                    report, files = _run(plan, spec, log_dir or temporary, lambda message: show(scrub(message)))
                except KvpreflightError as exc:  # an engine may echo a key into an error message
                    raise type(exc)(scrub(str(exc))) from None
            preflight.publish(report, out, files_read=files, secrets=plan.auth.secrets, progress=say)
        finally:
            if temporary is not None and keep:
                say(f"engine logs kept in {temporary}")
            elif temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)
        raise typer.Exit(report.exit_code)


def _run(plan: CheckPlan, spec: DeploymentSpec | None, log_dir: Path | None,
         say: Callable[[str], None]) -> tuple[Report, tuple[Path, ...]]:
    from kvpreflight import preflight

    if spec is None:
        return preflight.run(plan, say), tuple(plan.logs.values())
    import tempfile

    folder = log_dir or Path(tempfile.mkdtemp(prefix=f"kvpreflight-{spec.deployment}-"))
    booted = preflight.run_booted(spec, plan, log_dir=folder, progress=say)
    return booted.report, booted.files_read


def _print_plan(plan: CheckPlan, spec: DeploymentSpec | None, *, measure: bool, fmt: str | None, output: Path | None,
                unwanted: tuple[object, ...]) -> None:
    """`check --plan`: print what the check would send; exit 0, or 2 for a plan over its limit."""
    import json

    from kvpreflight import preflight
    from kvpreflight.errors import ConfigError
    from kvpreflight.formats import write_text
    from kvpreflight.formats._common import output_width
    from kvpreflight.redact import Redactor
    from kvpreflight.request_plan import render, to_dict

    if spec is not None:
        raise ConfigError("--plan reads running engines; drop --boot (boot the deployment, then --plan its endpoints)")
    if any(unwanted):
        raise ConfigError("--plan writes no record; drop --record, --subject, --unsigned and --test-result")
    if fmt not in (None, "table", "json"):
        raise ConfigError(f"--plan prints a table or JSON, not --format {fmt}")
    scrub = Redactor(plan.auth.secrets).text
    previews = preflight.preview(plan, measure=measure, progress=lambda message: progress(scrub(message)))
    width = output_width(sys.stdout) if output is None else None
    text = json.dumps(to_dict(previews), indent=2) + "\n" if fmt == "json" else render(previews, width)
    write_text(scrub(text), output)
