"""The demo: a builtin prefill/decode deployment booted by the one launcher (kvpreflight.boot),
checked end to end through its router, with a signed record and a fresh key.

--incident replays the 2026 leak: the prefill pool is 0.65x the served context, the engines run
the pre-0.5.21 reject path, and before the probes the pool is filled with another tenant's
synthetic marker. The report then shows that marker coming back in the probe's response.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine.config import FAULTS_ENV
from kvpreflight._internal.builtin_engine.deployment import BuiltinDeployment
from kvpreflight.errors import ConfigError, NotMeasured
from kvpreflight.model import Report, RouterKind

if TYPE_CHECKING:
    from kvpreflight.boot.deployment import BootedDeployment
    from kvpreflight.boot.spec import DeploymentSpec
    from kvpreflight.check_plan import OutputPlan

PAGE_SIZE = 16
# The prefill->decode link is paced (ms before each 8-page batch), so a long prompt's KV takes a
# few hundred ms to move, as over a real network; unpaced, a local copy is over before a client
# disconnect can land mid-transfer, and the cancel-during-transfer probe could never see a leak.
TRANSFER_DELAY_MS = 6
SMG_ENV = "KVPREFLIGHT_SMG"  # the smg binary; scripts/setup_engines.sh --only smg installs one
SMG_SETUP = "install it with scripts/setup_engines.sh --only smg (or pip install smg==1.13.0), or set KVPREFLIGHT_SMG"
SGLANG_ROUTER_ENV = "KVPREFLIGHT_SGLANG_ROUTER_PYTHON"  # a Python with sglang-router installed
SGLANG_ROUTER_SETUP = ("install it with scripts/setup_engines.sh --only smg (or pip install sglang-router==0.3.2), "
                       f"or set {SGLANG_ROUTER_ENV}")


# `kvpreflight demo`'s flag of each BuiltinDeployment field (a fleet inventory names them by YAML path).
DEMO_FLAGS = {"pool_ratio": "--pool-ratio", "decode_pool_ratio": "--decode-pool-ratio", "context_length": "--context-length",
              "faults": "--fault", "incident": "--incident", "router": "--router"}


def demo_flag(field: str) -> str:
    """The demo's flag of a BuiltinDeployment field (`faults[0]` is --fault)."""
    return DEMO_FLAGS[field.split("[")[0]]


def demo_deployment(*, router: str | None = None, name_of: Callable[[str], str] = demo_flag,
                    **fields: Any) -> BuiltinDeployment:
    """The deployment `kvpreflight demo`'s options describe (`router` as the user wrote it, the other
    fields as BuiltinDeployment's; None: its default), validated: ConfigError (exit 2) naming the option."""
    kind = RouterKind.BUILTIN
    if router is not None:
        try:
            kind = RouterKind(router)
        except ValueError:
            raise ConfigError(f"must be one of {', '.join(RouterKind)} (got {router!r})").under(name_of("router")) from None
    deployment = BuiltinDeployment(router=kind, **{name: value for name, value in fields.items() if value is not None})
    deployment.validate(name_of=name_of)
    return deployment


def demo_output(*, fmt: str | None, output: Path | None, quiet: bool, record: Path | None,
                command_line: Sequence[str]) -> OutputPlan:
    """The demo's report format and file; its record's key and subjects are the demo's own (a fresh
    key, its logs), so only where the record goes (`record`, checked writable now) comes from the user."""
    from kvpreflight._internal.files import check_writable
    from kvpreflight.check_options import build_output

    out = build_output(fmt=fmt, output=output, record=None, sign_key=None, subjects=(), unsigned=False,
                       command_line=tuple(command_line), reads_files=True, quiet=quiet)
    if record is not None:
        check_writable(record, "--record")
    return out


def say(message: str) -> None:
    from kvpreflight._internal.terminal import write_line

    write_line("kvpreflight demo", message)


def _cached_venv_file(venv: str, *parts: str) -> Path:
    cache = Path(os.environ.get("KVPREFLIGHT_CACHE") or Path.home() / ".cache" / "kvpreflight")
    return cache.joinpath(venv, *parts)


def find_smg() -> str:
    """The smg binary: $KVPREFLIGHT_SMG, else smg on PATH, else the one setup_engines.sh installs."""
    given = os.environ.get(SMG_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise ConfigError(f"{SMG_ENV}={given} is not an executable smg binary; {SMG_SETUP}")
        return given
    for candidate in (shutil.which("smg"), _cached_venv_file("smg-venv", "bin", "smg")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ConfigError(f"--router smg needs the smg binary and none was found; {SMG_SETUP}")


def find_sglang_router_python() -> str:
    """A Python with sglang_router installed: $KVPREFLIGHT_SGLANG_ROUTER_PYTHON, else the venv
    setup_engines.sh installs it into."""
    import subprocess

    given = os.environ.get(SGLANG_ROUTER_ENV)
    candidate = given or str(_cached_venv_file("sglang-router-venv", "bin", "python"))
    if os.access(candidate, os.X_OK):
        probe = subprocess.run([candidate, "-c", "import sglang_router"], capture_output=True, timeout=60, check=False)
        if probe.returncode == 0:
            return candidate
    if given:
        raise ConfigError(f"{SGLANG_ROUTER_ENV}={given} is not a Python with sglang_router installed; {SGLANG_ROUTER_SETUP}")
    raise ConfigError(f"--router sglang-router needs sglang_router and none was found; {SGLANG_ROUTER_SETUP}")


def _router(settings: BuiltinDeployment, bootstrap_port: int | None) -> dict[str, Any]:
    if settings.router is RouterKind.BUILTIN:
        return {"name": "router", "role": "router", "engine": "builtin", "port": "auto", "ready_timeout_s": 60,
                "command": [sys.executable, "-m", "kvpreflight", "engine", "serve", "--role", "router",
                            "--host", "127.0.0.1", "--port", "{port}", "--prefill-url", "{prefill.url}",
                            "--decode-url", "{decode.url}"]}
    from kvpreflight.boot.launch import free_port

    assert bootstrap_port is not None  # demo_spec fixes it for any router but the builtin one
    # SGLang's routers are told the prefill's bootstrap port at launch (--prefill URL BOOTSTRAP_PORT);
    # their Prometheus listener would bind 0.0.0.0:29000 unless told otherwise.
    prometheus = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port(avoid={bootstrap_port}))]
    pd = ["--pd-disaggregation", "--prefill", "{prefill.url}", str(bootstrap_port), "--decode", "{decode.url}"]
    listen = ["--host", "127.0.0.1", "--port", "{port}"]
    if settings.router is RouterKind.SMG:
        command = [find_smg(), "launch", *pd, "--backend", "sglang", *listen, *prometheus]
    else:
        command = [find_sglang_router_python(), "-m", "sglang_router.launch_router", *pd, *listen, *prometheus]
    return {"name": "router", "role": "router", "engine": settings.router.value, "port": "auto",
            "ready_timeout_s": 60, "command": command}


def demo_spec(settings: BuiltinDeployment) -> DeploymentSpec:
    from kvpreflight.boot import parse_spec
    from kvpreflight.boot.launch import free_port

    ratio, faults = settings.prefill_pool_ratio, settings.engine_faults
    ctx = settings.context_length
    prefill_pool = max(PAGE_SIZE, int(ctx * ratio))
    decode_pool = max(PAGE_SIZE, int(ctx * settings.decode_pool_ratio))
    env = {FAULTS_ENV: ",".join(faults)} if faults else {}
    # The builtin router asks the prefill for its bootstrap port; other routers are told it.
    bootstrap_port = None if settings.router is RouterKind.BUILTIN else free_port()

    def worker(role: str, pool: int) -> dict[str, Any]:
        extra = []
        if role == "prefill":
            extra = ["--transfer-delay-ms", str(TRANSFER_DELAY_MS)]
            if bootstrap_port is not None:
                extra += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
        return {
            "name": role, "role": role, "engine": "builtin", "port": "auto", "ready_timeout_s": 120, "env": env,
            "command": [sys.executable, "-m", "kvpreflight", "engine", "serve", "--role", role, "--host", "127.0.0.1",
                        "--port", "{port}", "--context-length", str(ctx), "--pool-tokens", str(pool), "--enable-metrics",
                        *extra],
        }

    data = {
        "deployment": "kvpreflight-demo",
        "context_length": ctx,
        "entry": "router",
        "engines": [worker("prefill", prefill_pool), worker("decode", decode_pool), _router(settings, bootstrap_port)],
    }
    return parse_spec(data, source="kvpreflight demo")


def plant_other_tenant(entry_url: str, marker: str, tokens: int, copies: int) -> None:
    """Fill the decode pool with another tenant's requests (then freed; pages are not zeroed)."""
    from concurrent.futures import ThreadPoolExecutor

    from kvpreflight._internal.engines.http import HttpClient

    text = (f"{marker} " * (tokens // (len(marker) + 1) + 1))[:tokens]
    client = HttpClient(timeout_s=120)
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    try:
        with ThreadPoolExecutor(max_workers=copies) as pool:
            replies = list(pool.map(lambda _: client.post(f"{entry_url}/generate", body), range(copies)))
    finally:
        client.close()
    bad = [r.status for r in replies if r.status != 200]
    if bad:
        raise NotMeasured(f"demo: the other tenant's requests were refused (HTTP {bad}); cannot set up the incident")


@dataclass(frozen=True)
class DemoRun:
    report: Report
    record: Path
    public_key: Path | None  # the fresh key's public half, when the demo made one


DEFAULT_OUT = Path("kvpreflight-demo")  # in the working directory: what a user needs after the demo


def run_demo(deployment: BuiltinDeployment, output: OutputPlan, *, log_dir: Path | None = None,
             sign_key: str | None = None, allow_insecure_key: bool = False, record_path: Path | None = None,
             command_line: Sequence[str] = ("kvpreflight", "demo"),
             progress: Callable[[str], None] = say, out_dir: Path | None = None, keep: bool = False) -> DemoRun:
    """Boot the deployment, check it through its router, publish the report and a signed record
    (to `record_path`, default `out_dir`/record.dsse.json; signed with the key in `out_dir`/keys,
    made on the first run, unless `sign_key` is given), stop everything. The engines' logs go to
    `log_dir`, else to a temporary folder removed afterwards (to `out_dir`/logs with `keep`)."""
    deployment.validate()
    out_dir = out_dir or DEFAULT_OUT
    spec = demo_spec(deployment)  # before any file is written: it may find no smg to run
    record_path = record_path or out_dir / "record.dsse.json"
    pub_path = None
    if sign_key is None:
        from kvpreflight.record import generate, write_keypair
        from kvpreflight.record.keys import PRIVATE_NAME, PUBLIC_NAME

        keys = out_dir / "keys"
        if (keys / PRIVATE_NAME).is_file() and (keys / PUBLIC_NAME).is_file():
            key_path, pub_path = keys / PRIVATE_NAME, keys / PUBLIC_NAME  # the key an earlier demo made
        else:
            key_path, pub_path = write_keypair(keys, generate())
        sign_key = str(key_path)
    from kvpreflight.boot import log_folder

    with log_folder(log_dir, keep=keep, prefix="kvpreflight-demo-logs-", kept_in=out_dir / "logs", say=progress) as folder:
        return _run_demo(deployment, output, spec, log_dir=folder, sign_key=sign_key, record_path=record_path,
                         pub_path=pub_path, command_line=command_line, progress=progress,
                         allow_insecure_key=allow_insecure_key)


def _run_demo(deployment: BuiltinDeployment, output: OutputPlan, spec: Any, *, log_dir: Path, sign_key: str,
              record_path: Path, pub_path: Path | None, command_line: Sequence[str],
              progress: Callable[[str], None], allow_insecure_key: bool) -> DemoRun:
    from kvpreflight import preflight
    from kvpreflight._internal.probes.markers import new_marker
    from kvpreflight.check_plan import CheckPlan

    # The demo's logs and spec are the record's subjects.
    record = preflight.prepare_record(record_path, sign_key=sign_key, subjects=(), unsigned=False,
                                      command_line=command_line, reads_files=True, allow_insecure_key=allow_insecure_key)
    output = replace(output, record=record)
    tenant_marker = new_marker("TENANT")
    plan = CheckPlan(targets=(), known_markers=frozenset({tenant_marker}) if deployment.incident else frozenset())

    def before_check(booted: BootedDeployment) -> None:
        if deployment.incident:
            from kvpreflight._internal.engines.http import HttpClient

            # The longest prompt the prefill engine really takes (it rounds its pool to pages);
            # a longer one would become a placeholder under the incident's fault and plant nothing.
            client = HttpClient(timeout_s=30)
            try:
                info = client.get_json(f"{booted.engine('prefill').url}/server_info")
            finally:
                client.close()
            prefill_limit = int(info["max_req_input_len"]) - 1
            progress(f"tenant B fills the pool: 3 requests of {prefill_limit:,} tokens carrying {tenant_marker}")
            plant_other_tenant(booted.entry_url, tenant_marker, prefill_limit, copies=3)

    progress(f"booting a builtin prefill/decode deployment behind the {deployment.router} router "
        f"(context {deployment.context_length:,}, "
        f"prefill pool {deployment.prefill_pool_ratio}x, decode pool {deployment.decode_pool_ratio}x"
        + (f", faults: {', '.join(deployment.engine_faults)}" if deployment.engine_faults else "") + ")")
    booted = preflight.run_booted(spec, plan, log_dir=log_dir, before_check=before_check,
                                  progress=progress)
    preflight.publish(booted.report, output, files_read=booted.files_read, progress=progress)  # prints the verify command
    return DemoRun(booted.report, record_path, pub_path)
