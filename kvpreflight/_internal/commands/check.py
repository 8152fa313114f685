"""`kvpreflight check`: prove live engines' KV pools hold the served context and that
over-capacity requests are hard-rejected. Parses arguments into a `CheckPlan`, calls
`kvpreflight.preflight`, writes the outputs, returns the exit code. The rules between the options
that choose the mode (attach, --boot, --plan) are `check_options`' (`check_targets_mode`, `check_plan_mode`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvpreflight._internal.commands import options
from kvpreflight._internal.commands._run import progress
from kvpreflight._internal.probes.results import ScenarioName
from kvpreflight.targets import REQUEST_TIMEOUT_S

if TYPE_CHECKING:
    from kvpreflight.boot.spec import DeploymentSpec
    from kvpreflight.check_plan import CheckPlan
    from kvpreflight.model import Report

SCENARIO_HELP = (f"Run only this isolation scenario ({', '.join(s.value for s in ScenarioName)}); repeatable. The others "
                 "are reported as not selected. \\[default: all]")


CHECK_EXAMPLES = (
    "Examples:\n\n"
    "kvpreflight check --endpoint http://localhost:30000\n\n"
    "kvpreflight check --entry http://router:8000 --context-length 1048576\n\n"
    "kvpreflight check --endpoint URL --plan\n\n"
    "kvpreflight check --endpoint URL --record release.dsse.json --sign-key kvpreflight.key --subject image=sha256:HEX\n\n"
    "kvpreflight check --boot examples/specs/builtin-pd.yaml"
)


def register(app: typer.Typer) -> None:
    @app.command("check", epilog=CHECK_EXAMPLES)
    def check(
        endpoints: list[str] | None = options.ENDPOINTS,
        entry_api: str = options.ENTRY_API,
        entry_model: str | None = options.ENTRY_MODEL,
        entry: str | None = options.ENTRY,
        engine: str = options.ENGINE,
        model: str | None = options.MODEL,
        context_length: int | None = options.CONTEXT_LENGTH,
        logs: list[str] | None = options.LOGS,
        api_key_env: str | None = options.API_KEY_ENV,
        api_key_file: Path | None = options.API_KEY_FILE,
        headers: list[str] | None = options.HEADERS,
        secret_headers: list[str] | None = options.SECRET_HEADERS,
        ca_bundle: Path | None = options.CA_BUNDLE,
        client_cert: Path | None = options.CLIENT_CERT,
        client_key: Path | None = options.CLIENT_KEY,
        capacity_only: bool = typer.Option(False, "--capacity-only", rich_help_panel="Probes",
            help="Read-only: send no request (production endpoints under a change freeze)."),
        tenant_a_key_env: str | None = options.TENANT_A_KEY_ENV,
        tenant_b_key_env: str | None = options.TENANT_B_KEY_ENV,
        tenant_header: str | None = options.TENANT_HEADER,
        allow_disruptive: bool = typer.Option(False, "--allow-disruptive", rich_help_panel="Isolation",
            help="Also run the isolation scenarios that churn the engine (client disconnects, load near the pool) against a live "
                 "deployment."),
        scenarios: list[str] | None = typer.Option(None, "--scenario", metavar="NAME", rich_help_panel="Isolation", help=SCENARIO_HELP),
        skips: list[str] | None = typer.Option(None, "--skip", metavar="CHECK_ID", rich_help_panel="Probes",
            help="Waive a check id; needs a matching --reason. Repeatable."),
        reasons: list[str] | None = typer.Option(None, "--reason", metavar="TEXT", rich_help_panel="Probes",
            help="Why the matching --skip is waived (kept in the report and record)."),
        untils: list[str] | None = typer.Option(None, "--until", metavar="YYYY-MM-DD", rich_help_panel="Probes",
            help="YYYY-MM-DD: the matching --skip's last day; `verify` refuses a record whose waiver expired."),
        fmt: str | None = options.FORMAT,
        output: Path | None = options.OUTPUT,
        quiet: bool = options.QUIET,
        name: str | None = options.NAME,
        # watch's --timeout waits for one read or canary (10 s): declared there.
        timeout: float = typer.Option(REQUEST_TIMEOUT_S, "--timeout", metavar="S", rich_help_panel="Budgets",
            help="Seconds to wait for a rejection or a short request; accepted long prompts get more, from the engine's measured "
                 "speed."),
        plan_only: bool = typer.Option(False, "--plan", rich_help_panel="Budgets",
            help="Print the probes it would send, their sizes, context-equivalents and expected duration; sends only one short "
                 "calibration request per entry (the duration is then an upper estimate)."),
        no_calibrate: bool = typer.Option(False, "--no-calibrate", rich_help_panel="Budgets",
            help="With --plan: send no request at all (the duration is then unknown)."),
        max_context_equivalents: float | None = typer.Option(None, "--max-context-equivalents", metavar="N", rich_help_panel="Budgets",
            help="Refuse (exit 2, before any request) a plan that submits more prompt tokens than N times the context."),
        deadline: float | None = typer.Option(None, "--deadline", metavar="S", rich_help_panel="Budgets",
            help="Seconds the whole check may take; past it, exit 3 naming the stage. \\[default: 3x the estimate printed after "
                 "calibration, plus room for waits]"),
        concurrency: int | None = typer.Option(None, "--concurrency", metavar="N", rich_help_panel="Probes",
            help="Near-limit requests sent at once by concurrent-capacity. \\[default: from checks/thresholds.yaml]"),
        timing_samples: int | None = typer.Option(None, "--timing-samples", metavar="N", rich_help_panel="Isolation",
            help="Requests per kind (cold, same-tenant warm, cross-tenant, each tenant's fresh) of the prefix-cache timing audit, "
                 "sent only where the engine reports no cache hits. \\[default: 30]"),
        accepted_tokens_per_second: float | None = typer.Option(None, "--accepted-tokens-per-second", metavar="N",
            rich_help_panel="Budgets",
            help="Assumed prompt speed for budgets only when the engine's speed could not be measured."),
        advisories: list[Path] | None = options.ADVISORIES,
        # demo's --record has a default path and fleet's writes one record per deployment: each declares its own.
        record: Path | None = typer.Option(None, "--record", metavar="PATH", rich_help_panel="Record",
            help="Write a signed release record (DSSE, in-toto) of this run here, pass or fail."),
        sign_key: str | None = options.SIGN_KEY,
        allow_insecure_key: bool = options.ALLOW_INSECURE_KEY,
        subject: list[str] | None = options.SUBJECTS,
        unsigned: bool = options.UNSIGNED,
        test_result: Path | None = typer.Option(None, "--test-result", metavar="PATH", rich_help_panel="Record",
            help="With --record: also write an in-toto Test Result (DSSE, same key and subjects) here."),
        boot: Path | None = typer.Option(None, "--boot", metavar="SPEC.yaml", rich_help_panel="Boot",
            help="Boot the deployment in this spec (YAML), check it, stop everything."),
        keep: bool = typer.Option(False, "--keep", rich_help_panel="Boot",
            help="With --boot and no --log-dir: keep the engines' logs (the folder is printed) instead of removing them."),
        log_dir: Path | None = typer.Option(None, "--log-dir", metavar="DIR", rich_help_panel="Boot",
            help="With --boot: where engine logs go. \\[default: a temporary folder, removed afterwards unless --keep]"),
    ) -> None:
        """Check running engines (or boot them from a spec with --boot). Exit 0 pass, 1 a check failed, 2 usage error, 3 inconclusive."""
        from kvpreflight.check_options import options_from

        args = options_from(locals())  # the parameters are CheckOptions' fields
        from kvpreflight import preflight
        from kvpreflight.check_options import build_output, build_plan, check_plan_mode, check_targets_mode, load_boot_spec

        # Everything is validated here, before any engine is contacted or booted.
        check_targets_mode(args, boot=boot, log_dir=log_dir, keep=keep)
        spec = load_boot_spec(boot, allow_insecure_key=allow_insecure_key) if boot is not None else None
        plan = build_plan(args, booted=spec is not None)
        check_plan_mode(boot=boot, plan_only=plan_only, no_calibrate=no_calibrate, fmt=fmt, record=record,
                        subjects=tuple(subject or ()), unsigned=unsigned, test_result=test_result)
        if plan_only:
            _print_plan(plan, measure=not no_calibrate, fmt=fmt, output=output)
            return
        out = build_output(fmt=fmt, output=output, record=record, sign_key=sign_key, subjects=tuple(subject or ()),
                           unsigned=unsigned, command_line=tuple(sys.argv), reads_files=bool(plan.logs) or spec is not None,
                           test_result=test_result, advisory_dirs=plan.advisory_dirs, spec=boot, name=name, quiet=quiet,
                           allow_insecure_key=allow_insecure_key)
        preflight.validate(plan)
        from kvpreflight._internal.redact import Redactor
        from kvpreflight._internal.terminal import progress_to_stderr
        from kvpreflight.errors import KvpreflightError

        scrub = Redactor(plan.auth.secrets).text

        def say(message: str) -> None:
            progress(scrub(message))

        from contextlib import AbstractContextManager, nullcontext

        folder: AbstractContextManager[Path | None] = nullcontext(None)
        if spec is not None:
            from kvpreflight.boot import log_folder

            # Where the logs go is the library's rule, and they stay until the report and record are written.
            folder = log_folder(log_dir, keep=keep, prefix="kvpreflight-boot-", say=say)
        with folder as boot_logs:
            with progress_to_stderr("kvpreflight") as show:  # a live line on a terminal, plain lines in CI
                try:
                    report, files = _run(plan, spec, boot_logs, lambda message: show(scrub(message)))
                except KvpreflightError as exc:  # an engine may echo a key into an error message
                    raise type(exc)(scrub(str(exc))) from None
            preflight.publish(report, out, files_read=files, secrets=plan.auth.secrets, progress=say)
        raise typer.Exit(report.exit_code)


def _run(plan: CheckPlan, spec: DeploymentSpec | None, log_dir: Path | None,
         say: Callable[[str], None]) -> tuple[Report, tuple[Path, ...]]:
    from kvpreflight import preflight

    if spec is None:
        return preflight.run(plan, say), tuple(plan.logs.values())
    assert log_dir is not None  # kvpreflight.boot.log_folder named one
    booted = preflight.run_booted(spec, plan, log_dir=log_dir, progress=say)
    return booted.report, booted.files_read


def _print_plan(plan: CheckPlan, *, measure: bool, fmt: str | None, output: Path | None) -> None:
    """`check --plan`: print what the check would send; exit 0, or 2 for a plan over its limit."""
    import json

    from kvpreflight import preflight
    from kvpreflight._internal.redact import Redactor
    from kvpreflight._internal.request_plan import render, to_dict
    from kvpreflight.formats import write_text
    from kvpreflight.formats._common import output_width

    scrub = Redactor(plan.auth.secrets).text
    previews = preflight.preview(plan, measure=measure, progress=lambda message: progress(scrub(message)))
    width = output_width(sys.stdout) if output is None else None
    text = json.dumps(to_dict(previews), indent=2) + "\n" if fmt == "json" else render(previews, width)
    write_text(scrub(text), output)
