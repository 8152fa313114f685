"""The demo: a builtin prefill/decode deployment booted by the one launcher (kvpreflight.boot),
checked end to end through its router, with a signed record and a fresh key.

--incident replays the 2026 leak: the prefill pool is 0.65x the served context, the engines run
the pre-0.5.21 reject path, and before the probes the pool is filled with another tenant's
synthetic marker. The report then shows that marker coming back in the probe's response.
"""

from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvpreflight.builtin_engine.config import FAULTS, FAULTS_ENV
from kvpreflight.errors import NotMeasured, UsageError

INCIDENT_POOL_RATIO = 0.65  # 681,280 / 1,048,576
INCIDENT_FAULTS = ("reject-continues", "no-transfer-check")
PAGE_SIZE = 16
# The prefill->decode link is paced (ms before each 8-page batch), so a long prompt's KV takes a
# few hundred ms to move, as over a real network; unpaced, a local copy is over before a client
# disconnect can land mid-transfer, and the cancel-during-transfer probe could never see a leak.
TRANSFER_DELAY_MS = 6


@dataclass(frozen=True)
class DemoSettings:
    pool_ratio: float = 2.0
    decode_pool_ratio: float = 2.0
    context_length: int = 8192
    faults: tuple[str, ...] = ()
    incident: bool = False
    fmt: str | None = None
    output: Path | None = None
    record: Path | None = None
    sign_key: str | None = None
    log_dir: Path | None = None

    @property
    def prefill_pool_ratio(self) -> float:
        return INCIDENT_POOL_RATIO if self.incident else self.pool_ratio

    @property
    def engine_faults(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.faults) | (set(INCIDENT_FAULTS) if self.incident else set())))


def say(message: str) -> None:
    sys.stderr.write(f"kvpreflight demo: {message}\n")
    sys.stderr.flush()


def demo_spec(settings: DemoSettings):
    from kvpreflight.boot import parse_spec

    ratio, faults = settings.prefill_pool_ratio, settings.engine_faults
    ctx = settings.context_length
    prefill_pool = max(PAGE_SIZE, int(ctx * ratio))
    decode_pool = max(PAGE_SIZE, int(ctx * settings.decode_pool_ratio))
    env = {FAULTS_ENV: ",".join(faults)} if faults else {}

    def worker(role: str, pool: int) -> dict:
        return {
            "name": role, "role": role, "engine": "builtin", "port": "auto", "ready_timeout_s": 120, "env": env,
            "command": [sys.executable, "-m", "kvpreflight", "engine", "serve", "--role", role, "--host", "127.0.0.1",
                        "--port", "{port}", "--context-length", str(ctx), "--pool-tokens", str(pool), "--enable-metrics",
                        *(["--transfer-delay-ms", str(TRANSFER_DELAY_MS)] if role == "prefill" else [])],
        }

    data = {
        "deployment": "kvpreflight-demo",
        "context_length": ctx,
        "entry": "router",
        "engines": [
            worker("prefill", prefill_pool),
            worker("decode", decode_pool),
            {"name": "router", "role": "router", "engine": "builtin", "port": "auto", "ready_timeout_s": 60,
             "command": [sys.executable, "-m", "kvpreflight", "engine", "serve", "--role", "router", "--host", "127.0.0.1",
                         "--port", "{port}", "--prefill-url", "{prefill.url}", "--decode-url", "{decode.url}"]},
        ],
    }
    return parse_spec(data, source="kvpreflight demo")


def plant_other_tenant(entry_url: str, marker: str, tokens: int, copies: int) -> None:
    """Fill the decode pool with another tenant's requests (then freed; pages are not zeroed)."""
    from kvpreflight.engines.http import HttpClient

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


def run_demo(settings: DemoSettings) -> int:
    from kvpreflight.commands.run_check import CheckRequest, execute_booted
    from kvpreflight.probes.markers import new_marker

    unknown = [f for f in settings.faults if f not in FAULTS]
    if unknown:
        raise UsageError(f"--fault {unknown[0]!r}: unknown; choose from {', '.join(FAULTS)}")
    for name, value in (("--pool-ratio", settings.pool_ratio), ("--decode-pool-ratio", settings.decode_pool_ratio)):
        if not 0 < value <= 64:
            raise UsageError(f"{name} must be between 0 and 64 (got {value})")
    if not 256 <= settings.context_length <= 262144:
        raise UsageError(f"--context-length must be between 256 and 262144 for the demo (got {settings.context_length})")

    folder = Path(tempfile.mkdtemp(prefix="kvpreflight-demo-"))
    record = settings.record or folder / "record.dsse.json"
    sign_key = settings.sign_key
    if sign_key is None:
        from kvpreflight.record import generate, write_keypair

        key_path, pub_path = write_keypair(folder / "keys", generate())
        sign_key = str(key_path)
    else:
        pub_path = None
    spec = demo_spec(settings)
    tenant_marker = new_marker("TENANT")
    known = frozenset({tenant_marker}) if settings.incident else frozenset()

    def before_check(deployment) -> None:
        if settings.incident:
            from kvpreflight.engines.http import HttpClient

            # The longest prompt the prefill engine really takes (it rounds its pool to pages);
            # a longer one would become a placeholder under the incident's fault and plant nothing.
            client = HttpClient(timeout_s=30)
            try:
                info = client.get_json(f"{deployment.engine('prefill').url}/server_info")
            finally:
                client.close()
            prefill_limit = int(info["max_req_input_len"]) - 1
            say(f"tenant B fills the pool: 3 requests of {prefill_limit:,} tokens carrying {tenant_marker}")
            plant_other_tenant(deployment.entry_url, tenant_marker, prefill_limit, copies=3)

    request = CheckRequest(
        endpoints=(), fmt=settings.fmt, output=settings.output, record=record, sign_key=sign_key,
        subjects=(), known_markers=known,
    )
    say(f"booting a builtin prefill/decode deployment (context {settings.context_length:,}, "
        f"prefill pool {settings.prefill_pool_ratio}x, decode pool {settings.decode_pool_ratio}x"
        + (f", faults: {', '.join(settings.engine_faults)}" if settings.engine_faults else "") + ")")
    code = execute_booted(spec, request, log_dir=settings.log_dir or folder / "logs", before_check=before_check)
    if pub_path is not None:
        say(f"verify the record: kvpreflight verify {record} --key {pub_path} --any-subject"
            + (" --allow-fail" if code != 0 else ""))
    return code
