"""The one option model of a check: `CheckOptions` (every option as a user gives it, unparsed)
and `build_plan`, which owns every rule between them and turns them into a `CheckPlan`.

The CLI (`check`, `watch`, `demo`), the fleet inventory's `attach:` entries and the library all
build plans here; only the way an error names an option differs (`Label`): the CLI says
"--endpoint", an inventory "fleet.yaml: deployments[2].attach.endpoints". A new option is one
field of `CheckOptions` (and one typer parameter in `commands/options.py`); an inventory accepts
it with no other edit (`kvpreflight.fleet.inventory` reads the fields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.files import FileKind, check_file, check_private, check_writable
from kvpreflight.check_plan import CheckPlan, OutputPlan
from kvpreflight.errors import ConfigError, naming
from kvpreflight.model import EntryApi
from kvpreflight.targets import REQUEST_TIMEOUT_S

if TYPE_CHECKING:
    from kvpreflight.boot.spec import DeploymentSpec

__all__ = ["CheckOptions", "Label", "build_output", "build_plan", "check_fields", "check_plan_mode", "check_targets_mode", "flag",
           "load_boot_spec", "options_from", "under"]

# Two samples of 7 can differ at best with a Kolmogorov-Smirnov p of 2/C(14,7) = 0.00058 (8: 0.00016);
# above 1,000 the audit costs more than any deployment check should.
MIN_TIMING_SAMPLES = 8
MAX_TIMING_SAMPLES = 1000

# A CheckOptions field -> how an error names it ("--endpoint", "fleet.yaml: deployments[0].attach.endpoints").
Label = Callable[[str], str]

# The flags whose name is not the field's (a list field's flag is singular: it is repeated).
_FLAGS = {"endpoints": "--endpoint", "logs": "--log", "headers": "--header", "secret_headers": "--secret-header",
          "skips": "--skip", "reasons": "--reason", "untils": "--until", "scenarios": "--scenario"}
# Options that are the deployment's waivers: an inventory gives them as its `skip:` list.
WAIVER_FIELDS = ("skips", "reasons", "untils")


def flag(field: str) -> str:
    """The command-line flag of a CheckOptions field."""
    return _FLAGS.get(field, "--" + field.replace("_", "-"))


def under(where: str) -> Label:
    """Names fields as a YAML file does: `under("fleet.yaml: deployments[0].attach")`."""
    return lambda field: f"{where}.{field}"


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    """`check`'s options as a user gives them (flags, an inventory's attach entry), unparsed.

    Files and environment variables are only named here; `build_plan` reads them, so the options
    can travel to the node that runs the check (a fleet's Ray worker) and be read there."""

    endpoints: tuple[str, ...] = ()
    entry: str | None = None
    entry_api: str = "native"
    entry_model: str | None = None  # the model name clients send to the entry (a gateway's alias)
    engine: str = "auto"
    model: str | None = None
    context_length: int | None = None
    logs: tuple[str, ...] = ()  # URL=PATH
    api_key_env: str | None = None
    api_key_file: Path | None = None
    headers: tuple[str, ...] = ()  # 'Name: value'
    secret_headers: tuple[str, ...] = ()  # names of headers whose values are secrets
    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    allow_insecure_key: bool = False  # use a private key (--client-key, a key inside --client-cert) others can read
    capacity_only: bool = False
    skips: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    untils: tuple[str, ...] = ()
    timeout: float = REQUEST_TIMEOUT_S
    deadline: float | None = None
    max_context_equivalents: float | None = None
    concurrency: int | None = None
    timing_samples: int | None = None
    accepted_tokens_per_second: float | None = None
    advisories: tuple[Path, ...] = ()
    tenant_a_key_env: str | None = None
    tenant_b_key_env: str | None = None
    tenant_header: str | None = None
    allow_disruptive: bool = False
    scenarios: tuple[str, ...] = ()  # --scenario: only these isolation scenarios (none given: all)


def options_from(values: Mapping[str, Any], **fixed: Any) -> CheckOptions:
    """CheckOptions from a command's parameters (named as the fields; typer's None for an unused
    repeatable option is the empty tuple), plus `fixed` values the command decides itself."""
    given: dict[str, Any] = {}
    for f in dataclasses.fields(CheckOptions):
        if f.name in values:
            value = values[f.name]
            given[f.name] = tuple(value or ()) if isinstance(f.default, tuple) else value
    return CheckOptions(**{**given, **fixed})


def check_fields(options: CheckOptions, label: Label = flag) -> None:
    """Every rule that needs no file and no environment variable: URLs, names, numbers, and the
    rules between options. An inventory runs it where it is parsed; `build_plan` runs it first."""
    from kvpreflight import targets as t
    from kvpreflight._internal.check_ids import CHECK_IDS
    from kvpreflight._internal.engines import ENGINES

    with naming(label("endpoints")):
        endpoints = t.parse_endpoints(options.endpoints)
    with naming(label("entry")):
        entry = t.parse_url(options.entry) if options.entry else None
    if options.engine != "auto" and options.engine not in ENGINES:
        raise ConfigError(f"{label('engine')} {options.engine!r}: choose auto or one of {', '.join(ENGINES)}")
    _entry_api(options.entry_api, entry, label)
    if options.entry_model is not None and entry is None:
        raise ConfigError(f"{label('entry_model')} names the model at the {label('entry')} URL; add {label('entry')} URL")
    if options.entry_model is not None and not options.entry_model.strip():
        raise ConfigError(f"{label('entry_model')} is empty; give the model name clients send to the entry, or leave it out")
    for name in ("context_length", "timeout", "deadline", "max_context_equivalents", "concurrency", "accepted_tokens_per_second"):
        with naming(label(name)):
            t.positive(getattr(options, name))
    if options.timing_samples is not None and not MIN_TIMING_SAMPLES <= options.timing_samples <= MAX_TIMING_SAMPLES:
        raise ConfigError(f"{label('timing_samples')} {options.timing_samples}: give {MIN_TIMING_SAMPLES} to {MAX_TIMING_SAMPLES} "
                          "(fewer samples can never reach the audit's p < 0.001)")
    from kvpreflight._internal.probes.results import ScenarioName

    names = [s.value for s in ScenarioName]
    for scenario in options.scenarios:
        if scenario not in names:
            raise ConfigError(f"{label('scenarios')} {scenario!r}: choose one of {', '.join(names)}")
    if options.client_key is not None and options.client_cert is None:
        raise ConfigError(f"{label('client_key')} needs {label('client_cert')} (the certificate it belongs to)")
    with naming(label("logs")):
        for text in options.logs:
            # Without endpoints the router names the engines: any URL may be one of them.
            t.parse_log(text, [*(e.url for e in endpoints), *([entry] if entry else [])] if endpoints else None)
    with naming(label("headers")):
        for text in options.headers:
            t.parse_header(text)
    if options.api_key_env and options.api_key_file:
        raise ConfigError(f"{label('api_key_env')} and {label('api_key_file')} both given; pass one")
    a_env, b_env = options.tenant_a_key_env, options.tenant_b_key_env
    if bool(a_env) != bool(b_env):
        raise ConfigError(f"{label('tenant_a_key_env')} and {label('tenant_b_key_env')} go together: give both tenants their own key")
    if a_env and a_env == b_env:
        raise ConfigError(f"{label('tenant_a_key_env')} and {label('tenant_b_key_env')} name the same variable; "
                          "the tenants need different keys")
    if options.tenant_header is not None:
        with naming(label("tenant_header")):
            t.tenant_auth(None, None, options.tenant_header)
    if len(options.skips) != len(options.reasons):
        raise ConfigError(f"every {label('skips')} CHECK_ID needs its own {label('reasons')} TEXT (no reason, no skip)")
    if options.untils and len(options.untils) != len(options.skips):
        raise ConfigError(f"{label('untils')} DATE goes with each {label('skips')} (one per skip, in the same order), or with none")
    untils: tuple[str | None, ...] = options.untils or (None,) * len(options.skips)
    with naming(label("skips")):
        for c, r, u in zip(options.skips, options.reasons, untils, strict=True):
            t.parse_waiver(c, r, CHECK_IDS, u)


def build_plan(options: CheckOptions, *, booted: bool = False, label: Label = flag) -> CheckPlan:
    """The validated plan: `check_fields`, then the files and environment variables the options
    name are read (keys, tenant keys, certificates, logs). With `booted`, targets come later from
    the booted deployment."""
    from kvpreflight import targets as t
    from kvpreflight._internal.check_ids import CHECK_IDS
    from kvpreflight._internal.redact import secrets_of
    from kvpreflight.targets import Auth

    check_fields(options, label)
    endpoints = t.parse_endpoints(options.endpoints)
    entry = t.parse_url(options.entry) if options.entry else None
    if options.ca_bundle is not None:
        with naming(label("ca_bundle")):
            check_file(options.ca_bundle, FileKind.CERTIFICATE)
    if options.client_cert is not None:
        from kvpreflight._internal.engines.http import client_certificate

        # Loads and matches the files now (exit 2 naming the option, never the path or contents).
        client_certificate(str(options.client_cert), str(options.client_key) if options.client_key else None,
                           names=(label("client_cert"), label("client_key")))
        name, key_file = ("client_key", options.client_key) if options.client_key else ("client_cert", options.client_cert)
        with naming(label(name)):
            check_private(key_file, "the private key", allow_insecure=options.allow_insecure_key)
    for folder in options.advisories:
        if not folder.is_dir():
            raise ConfigError(f"{label('advisories')} {folder}: not a folder")
    logs = {}
    with naming(label("logs")):
        for text in options.logs:
            known = [*(e.url for e in endpoints), *([entry] if entry else [])] if endpoints else None
            url, path = t.parse_log(text, known)
            check_file(path, FileKind.LOG, whole=False)  # read at the first snapshot: refuse a pipe now
            logs[url] = path
    headers: dict[str, str] = {}
    secrets: set[str] = set()
    secret_headers = {n.strip().lower() for n in options.secret_headers}
    with naming(label("headers")):
        for text in options.headers:
            header_name, header_value = t.parse_header(text)
            headers[header_name] = header_value
            if t.SECRET_HEADER.search(header_name) or header_name.lower() in secret_headers:
                secrets.add(t.checked_secret(header_value, f"the value of header {header_name}"))
    key = None
    if options.api_key_env:
        with naming(f"{label('api_key_env')} {options.api_key_env}"):
            key = t.secret_from_env(options.api_key_env)
    elif options.api_key_file:
        with naming(label("api_key_file")):
            key = t.secret_from_file(options.api_key_file)
    if key:
        headers["Authorization"] = f"Bearer {key}"
        secrets.add(key)
    tenant_keys: list[str | None] = []
    for name, env_name in (("tenant_a_key_env", options.tenant_a_key_env), ("tenant_b_key_env", options.tenant_b_key_env)):
        with naming(f"{label(name)} {env_name}"):
            tenant_keys.append(t.secret_from_env(env_name) if env_name else None)
    secrets.update(k for k in tenant_keys if k)
    with naming(f"{label('tenant_a_key_env')}/{label('tenant_b_key_env')}/{label('tenant_header')}"):
        tenant_headers, binding = t.tenant_auth(
            tenant_keys[0], tenant_keys[1], options.tenant_header,
            key_names=(f"${options.tenant_a_key_env}", f"${options.tenant_b_key_env}"))
    untils: tuple[str | None, ...] = options.untils or (None,) * len(options.skips)
    waivers = tuple(t.parse_waiver(c, r, CHECK_IDS, u) for c, r, u in zip(options.skips, options.reasons, untils, strict=True))
    all_secrets = secrets_of(values=secrets, headers=[*headers.items(), *tenant_headers[0].items(), *tenant_headers[1].items()],
                             urls=[*(e.url for e in endpoints), entry])
    return CheckPlan(
        targets=endpoints, entry=entry, entry_api=EntryApi(options.entry_api), entry_model=options.entry_model,
        engine=options.engine, model=options.model,
        context_length=options.context_length, logs=logs,
        auth=Auth(headers=headers, ca_bundle=str(options.ca_bundle) if options.ca_bundle else None,
                  client_cert=str(options.client_cert) if options.client_cert else None,
                  client_key=str(options.client_key) if options.client_key else None,
                  tenant_headers=tenant_headers, tenant_binding=binding, secrets=all_secrets),
        capacity_only=options.capacity_only, timeout_s=options.timeout, deadline_s=options.deadline,
        max_context_equivalents=options.max_context_equivalents, concurrency=options.concurrency,
        timing_samples=options.timing_samples, accepted_tokens_per_second=options.accepted_tokens_per_second,
        allow_disruptive=options.allow_disruptive, scenarios=tuple(dict.fromkeys(options.scenarios)), waivers=waivers,
        advisory_dirs=options.advisories, booted=booted,
    )


def build_output(*, fmt: str | None, output: Path | None, record: Path | None, sign_key: str | None,
                 subjects: tuple[str, ...], unsigned: bool, command_line: tuple[str, ...],
                 reads_files: bool, test_result: Path | None = None, advisory_dirs: tuple[Path, ...] = (),
                 spec: Path | None = None, name: str | None = None, quiet: bool = False,
                 allow_insecure_key: bool = False) -> OutputPlan:
    """The report format and file, and the record plan (key loaded, subjects parsed) if asked for."""
    from kvpreflight.formats import FORMATS
    from kvpreflight.preflight import prepare_record

    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    for flag, path in (("--output", output), ("--record", record), ("--test-result", test_result)):
        if path is not None:
            check_writable(path, flag)
    record_plan = None
    if record is not None:
        record_plan = prepare_record(record, sign_key=sign_key, subjects=subjects, unsigned=unsigned,
                                     command_line=command_line, reads_files=reads_files, test_result=test_result,
                                     advisory_dirs=advisory_dirs, spec=spec, allow_insecure_key=allow_insecure_key)
    elif sign_key or subjects or unsigned or test_result:
        raise ConfigError("--sign-key, --subject, --unsigned and --test-result only make sense with --record FILE")
    if name is not None and not name.strip():
        raise ConfigError("--name is empty; give the deployment a name (for example prod-eu-1) or leave --name out")
    if quiet and fmt not in (None, "table"):
        raise ConfigError(f"--quiet leaves the passing checks out of the table; --format {fmt} keeps every check, drop --quiet")
    return OutputPlan(format=fmt or "table", path=output, record=record_plan, name=name, spec=spec, quiet=quiet)


def parse_entry_api(text: str, label: Label = flag) -> EntryApi:
    """--entry-api's value as the API it names; anything else a ConfigError listing the choices."""
    try:
        return EntryApi(text)
    except ValueError:
        raise ConfigError(f"{label('entry_api')} {text!r}: choose one of {', '.join(a.value for a in EntryApi)}") from None


def _entry_api(text: str, entry: str | None, label: Label) -> EntryApi:
    api = parse_entry_api(text, label)
    if api is EntryApi.OPENAI and entry is None:
        raise ConfigError(f"{label('entry_api')} openai names the API of the {label('entry')} URL; add {label('entry')} URL (the gateway)")
    return api


def check_targets_mode(options: CheckOptions, *, boot: Path | None, log_dir: Path | None, keep: bool) -> None:
    """Where `check` finds its engines: --boot SPEC, or --endpoint/--entry (attach), never both;
    checked before the spec or any file is read."""
    if boot is not None:
        if options.endpoints or options.entry or options.logs:
            raise ConfigError("--boot takes its engines, entry and logs from the spec; drop --endpoint, --entry and --log")
    elif log_dir is not None or keep:
        raise ConfigError(f"{'--log-dir' if log_dir is not None else '--keep'} only makes sense with --boot SPEC.yaml")
    elif not options.endpoints and not options.entry:
        raise ConfigError("no --endpoint given; pass the URL of every prefill, decode or unified engine, "
                          "--entry ROUTER (a router that lists its workers), or --boot SPEC.yaml")


def load_boot_spec(path: Path, *, allow_insecure_key: bool = False) -> DeploymentSpec:
    """`check --boot SPEC`: the spec, its client certificate and key checked (readable, matching,
    the key private unless `allow_insecure_key`) before anything boots."""
    from kvpreflight.boot import load_spec

    spec = load_spec(path)
    spec.check_client_certificate()
    spec.check_client_key_private(allow_insecure=allow_insecure_key)
    return spec


def check_plan_mode(*, boot: Path | None, plan_only: bool, no_calibrate: bool, fmt: str | None, record: Path | None = None,
                    subjects: tuple[str, ...] = (), unsigned: bool = False, test_result: Path | None = None) -> None:
    """What `check --plan` (print the probes, send at most a calibration request) takes; checked once the
    plan is built, before any engine is contacted. A plan writes no record: none of --record,
    --subject, --unsigned or --test-result."""
    writes_record = any((record, subjects, unsigned, test_result))
    if no_calibrate and not plan_only:
        raise ConfigError("--no-calibrate only makes sense with --plan")
    if not plan_only:
        return
    if boot is not None:
        raise ConfigError("--plan reads running engines; drop --boot (boot the deployment, then --plan its endpoints)")
    if writes_record:
        raise ConfigError("--plan writes no record; drop --record, --subject, --unsigned and --test-result")
    if fmt not in (None, "table", "json"):  # the plan is a table or JSON, not a report
        raise ConfigError(f"--plan prints a table or JSON, not --format {fmt}")
