"""Turns `check`'s (and `demo`'s) option values into a `CheckPlan` and an `OutputPlan`.

The parsing itself is the library's (`kvpreflight.targets`, `kvpreflight.preflight`); this module
only says which flag each value came from, so an error reads "--endpoint: 'ftp://x' is not ...".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvpreflight.check_plan import CheckPlan, OutputPlan
from kvpreflight.errors import ConfigError, naming
from kvpreflight.files import FileKind, check_file, check_private, check_writable
from kvpreflight.model import EntryApi

# Two samples of 7 can differ at best with a Kolmogorov-Smirnov p of 2/C(14,7) = 0.00058 (8: 0.00016);
# above 1,000 the audit costs more than any deployment check should.
MIN_TIMING_SAMPLES = 8
MAX_TIMING_SAMPLES = 1000


@dataclass(frozen=True, kw_only=True)
class CheckArgs:
    """`check`'s options as typed on the command line, unparsed."""

    endpoints: tuple[str, ...] = ()
    entry: str | None = None
    entry_api: str = "native"
    engine: str = "auto"
    model: str | None = None
    context_length: int | None = None
    logs: tuple[str, ...] = ()
    api_key_env: str | None = None
    api_key_file: Path | None = None
    headers: tuple[str, ...] = ()
    secret_headers: tuple[str, ...] = ()  # names of headers whose values are secrets
    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    allow_insecure_key: bool = False  # use a private key (--client-key, a key inside --client-cert) others can read
    capacity_only: bool = False
    skips: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    untils: tuple[str, ...] = ()
    timeout: float = 30.0
    deadline: float | None = None
    max_context_equivalents: float | None = None
    concurrency: int | None = None
    timing_samples: int | None = None
    accepted_tps: float | None = None
    advisories: tuple[Path, ...] = ()
    tenant_a_key_env: str | None = None
    tenant_b_key_env: str | None = None
    tenant_header: str | None = None
    allow_disruptive: bool = False


def build_plan(args: CheckArgs, *, booted: bool = False) -> CheckPlan:
    """The validated plan. With `booted`, targets come later from the booted deployment."""
    from kvpreflight import targets as t
    from kvpreflight.checks import CHECK_IDS
    from kvpreflight.engines import ENGINES
    from kvpreflight.targets import Auth

    with naming("--endpoint"):
        endpoints = t.parse_endpoints(args.endpoints)
    with naming("--entry"):
        entry = t.parse_url(args.entry) if args.entry else None
    if args.engine != "auto" and args.engine not in ENGINES:
        raise ConfigError(f"--engine {args.engine!r}: choose auto or one of {', '.join(ENGINES)}")
    for flag, value in (("--context-length", args.context_length), ("--timeout", args.timeout), ("--deadline", args.deadline),
                        ("--max-context-equivalents", args.max_context_equivalents),
                        ("--concurrency", args.concurrency), ("--accepted-tokens-per-second", args.accepted_tps)):
        with naming(flag):
            t.positive(value)
    if args.timing_samples is not None and not MIN_TIMING_SAMPLES <= args.timing_samples <= MAX_TIMING_SAMPLES:
        raise ConfigError(f"--timing-samples {args.timing_samples}: give {MIN_TIMING_SAMPLES} to {MAX_TIMING_SAMPLES} (fewer "
                          "samples can never reach the audit's p < 0.001)")
    if args.ca_bundle is not None:
        with naming("--ca-bundle"):
            check_file(args.ca_bundle, FileKind.CERTIFICATE)
    if args.client_key is not None and args.client_cert is None:
        raise ConfigError("--client-key needs --client-cert (the certificate it belongs to)")
    if args.client_cert is not None:
        from kvpreflight.engines.http import HttpClient

        # Loads and matches the files now (exit 2 naming the flag, never the path or contents).
        HttpClient(client_cert=str(args.client_cert), client_key=str(args.client_key) if args.client_key else None).close()
        flag, key_file = ("--client-key", args.client_key) if args.client_key else ("--client-cert", args.client_cert)
        with naming(flag):
            check_private(key_file, "the private key", allow_insecure=args.allow_insecure_key)
    for folder in args.advisories:
        if not folder.is_dir():
            raise ConfigError(f"--advisories {folder}: not a folder")
    logs = {}
    with naming("--log"):
        for text in args.logs:
            # Without --endpoint the router names the engines: any URL may be one of them.
            known = [*(e.url for e in endpoints), *([entry] if entry else [])] if endpoints else None
            url, path = t.parse_log(text, known)
            check_file(path, FileKind.LOG, whole=False)  # read at the first snapshot: refuse a pipe now
            logs[url] = path
    headers: dict[str, str] = {}
    secrets: set[str] = set()
    secret_headers = {n.strip().lower() for n in args.secret_headers}
    with naming("--header"):
        for text in args.headers:
            header_name, header_value = t.parse_header(text)
            headers[header_name] = header_value
            if t.SECRET_HEADER.search(header_name) or header_name.lower() in secret_headers:
                secrets.add(t.checked_secret(header_value, f"the value of header {header_name}"))
    if args.api_key_env and args.api_key_file:
        raise ConfigError("--api-key-env and --api-key-file both given; pass one")
    key = None
    if args.api_key_env:
        with naming(f"--api-key-env {args.api_key_env}"):
            key = t.secret_from_env(args.api_key_env)
    elif args.api_key_file:
        with naming("--api-key-file"):
            key = t.secret_from_file(args.api_key_file)
    if key:
        headers["Authorization"] = f"Bearer {key}"
        secrets.add(key)
    if bool(args.tenant_a_key_env) != bool(args.tenant_b_key_env):
        raise ConfigError("--tenant-a-key-env and --tenant-b-key-env go together: give both tenants their own key")
    if args.tenant_a_key_env and args.tenant_a_key_env == args.tenant_b_key_env:
        raise ConfigError("--tenant-a-key-env and --tenant-b-key-env name the same variable; the tenants need different keys")
    tenant_keys: list[str | None] = []
    for flag, env_name in (("--tenant-a-key-env", args.tenant_a_key_env), ("--tenant-b-key-env", args.tenant_b_key_env)):
        with naming(f"{flag} {env_name}"):
            tenant_keys.append(t.secret_from_env(env_name) if env_name else None)
    secrets.update(k for k in tenant_keys if k)
    with naming("--tenant-a-key-env/--tenant-b-key-env/--tenant-header"):
        tenant_headers, binding = t.tenant_auth(
            tenant_keys[0], tenant_keys[1], args.tenant_header,
            key_names=(f"${args.tenant_a_key_env}", f"${args.tenant_b_key_env}"))
    if len(args.skips) != len(args.reasons):
        raise ConfigError("every --skip CHECK_ID needs its own --reason TEXT (no reason, no skip)")
    if args.untils and len(args.untils) != len(args.skips):
        raise ConfigError("--until DATE goes with each --skip (one per --skip, in the same order), or with none")
    untils: tuple[str | None, ...] = args.untils or (None,) * len(args.skips)
    with naming("--skip"):
        waivers = tuple(t.parse_waiver(c, r, CHECK_IDS, u) for c, r, u in zip(args.skips, args.reasons, untils, strict=True))
    from kvpreflight.redact import secrets_of

    all_secrets = secrets_of(values=secrets, headers=[*headers.items(), *tenant_headers[0].items(), *tenant_headers[1].items()],
                             urls=[*(e.url for e in endpoints), entry])
    return CheckPlan(
        targets=endpoints, entry=entry, entry_api=_entry_api(args.entry_api, entry), engine=args.engine, model=args.model, context_length=args.context_length,
        logs=logs, auth=Auth(headers=headers, ca_bundle=str(args.ca_bundle) if args.ca_bundle else None,
                             client_cert=str(args.client_cert) if args.client_cert else None,
                             client_key=str(args.client_key) if args.client_key else None,
                             tenant_headers=tenant_headers, tenant_binding=binding, secrets=all_secrets),
        capacity_only=args.capacity_only, timeout_s=args.timeout, deadline_s=args.deadline, max_context_equivalents=args.max_context_equivalents, concurrency=args.concurrency,
        timing_samples=args.timing_samples, accepted_tokens_per_second=args.accepted_tps, allow_disruptive=args.allow_disruptive, waivers=waivers,
        advisory_dirs=args.advisories, booted=booted,
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


def _entry_api(text: str, entry: str | None) -> EntryApi:
    try:
        api = EntryApi(text)
    except ValueError:
        raise ConfigError(f"--entry-api {text!r}: choose one of {', '.join(a.value for a in EntryApi)}") from None
    if api is EntryApi.OPENAI and entry is None:
        raise ConfigError("--entry-api openai names the API of the --entry URL; add --entry URL (the gateway)")
    return api
