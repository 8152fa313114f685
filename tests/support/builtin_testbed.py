"""Start builtin engines as real subprocesses for tests and benchmarks, and stop them by PID (a test
helper: it does not ship in the wheel).

Not a general launcher (that is kvpreflight/boot/): just enough to bring up one unified engine
or a PD trio (prefill + decode + router) on free 127.0.0.1 ports and always take it down.

    with pd_trio(tmp_path, context_length=8192, prefill_pool=4096, decode_pool=16384) as trio:
        requests.post(trio.router.url + "/generate", json={...})
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpreflight._internal.builtin_engine.config import FAULTS_ENV, PARALLEL_SIZE_ENV
from kvpreflight._internal.builtin_engine.pagelog import read_page_log
from kvpreflight._internal.files import read_tail, writing
from kvpreflight.boot.launch import free_port  # below the ephemeral range (see there)

HOST = "127.0.0.1"


@dataclass
class RunningEngine:
    role: str
    url: str
    process: subprocess.Popen
    log_path: Path
    page_log: Path | None
    argv: tuple[str, ...]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return read_tail(self.log_path)

    def page_events(self) -> list[dict]:
        if self.page_log is None or not self.page_log.exists():
            return []
        return read_page_log(str(self.page_log))


@dataclass
class PDTrio:
    prefill: RunningEngine
    decode: RunningEngine
    router: RunningEngine

    @property
    def url(self) -> str:
        return self.router.url

    def all(self) -> list[RunningEngine]:
        return [self.router, self.prefill, self.decode]


def engine_argv(role: str, port: int, *, context_length: int | None = None, pool_tokens: int | None = None,
                page_log: Path | None = None, enable_metrics: bool = True, extra_args: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "kvpreflight", "engine", "serve", "--role", role, "--host", HOST, "--port", str(port)]
    if context_length is not None:
        argv += ["--context-length", str(context_length)]
    if pool_tokens is not None:
        argv += ["--pool-tokens", str(pool_tokens)]
    if page_log is not None:
        argv += ["--page-log", str(page_log)]
    if enable_metrics and role != "router":
        argv.append("--enable-metrics")
    return argv + list(extra_args)


def start_engine(role: str, workdir: Path, *, name: str | None = None, context_length: int | None = None,
                 pool_tokens: int | None = None, faults: Sequence[str] = (), page_log: bool = False,
                 enable_metrics: bool = True, extra_args: Sequence[str] = (), wait_s: float = 60.0,
                 port: int | None = None, env: Mapping[str, str] | None = None) -> RunningEngine:
    """`port`: this one (an engine restarted where the last one listened), else a free one.
    `env`: more environment for the engine (a fault's setting, e.g. PARALLEL_SIZE_ENV), never argv."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    name = name or role
    port = port or free_port()
    plog = workdir / f"{name}.pages.jsonl" if page_log else None
    argv = engine_argv(role, port, context_length=context_length, pool_tokens=pool_tokens, page_log=plog,
                       enable_metrics=enable_metrics, extra_args=extra_args)
    environ = dict(os.environ)
    environ.pop(FAULTS_ENV, None)
    environ.pop(PARALLEL_SIZE_ENV, None)
    if faults:
        environ[FAULTS_ENV] = ",".join(faults)  # faults never appear in argv
    environ.update(env or {})
    log_path = workdir / f"{name}.log"
    with writing(log_path) as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environ)
    engine = RunningEngine(role, f"http://{HOST}:{port}", process, log_path, plog, tuple(argv))
    try:
        _wait_healthy(engine, wait_s)
    except BaseException:
        stop_engine(engine)
        raise
    return engine


def _wait_healthy(engine: RunningEngine, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise RuntimeError(f"{engine.role} engine exited with {engine.process.returncode}: {engine.log_text()[-2000:]}")
        try:
            with urllib.request.urlopen(engine.url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{engine.role} engine at {engine.url} not healthy after {wait_s:.0f}s: {engine.log_text()[-2000:]}")


def stop_engine(engine: RunningEngine) -> None:
    """SIGTERM by PID, then SIGKILL if it does not exit within 5 s."""
    proc = engine.process
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        except ProcessLookupError:
            pass


def start_pd(workdir: Path, *, context_length: int, prefill_pool: int, decode_pool: int,
             prefill_faults: Sequence[str] = (), decode_faults: Sequence[str] = (), page_log: bool = True,
             prefill_args: Sequence[str] = (), decode_args: Sequence[str] = (),
             decode_context_length: int | None = None, wait_s: float = 60.0,
             prefill_env: Mapping[str, str] | None = None, decode_env: Mapping[str, str] | None = None) -> PDTrio:
    started: list[RunningEngine] = []
    try:
        decode = start_engine("decode", workdir, context_length=decode_context_length or context_length,
                              pool_tokens=decode_pool, faults=decode_faults, page_log=page_log, extra_args=decode_args,
                              wait_s=wait_s, env=decode_env)
        started.append(decode)
        prefill = start_engine("prefill", workdir, context_length=context_length, pool_tokens=prefill_pool,
                               faults=prefill_faults, page_log=page_log, extra_args=prefill_args, wait_s=wait_s,
                               env=prefill_env)
        started.append(prefill)
        router = start_engine("router", workdir, extra_args=["--prefill-url", prefill.url, "--decode-url", decode.url],
                              wait_s=wait_s)
        started.append(router)
    except BaseException:
        for engine in reversed(started):
            stop_engine(engine)
        raise
    return PDTrio(prefill, decode, router)


@contextlib.contextmanager
def unified_engine(workdir: Path, **kwargs: Any) -> Iterator[RunningEngine]:
    engine = start_engine("unified", workdir, **kwargs)
    try:
        yield engine
    finally:
        stop_engine(engine)


@contextlib.contextmanager
def pd_trio(workdir: Path, **kwargs: Any) -> Iterator[PDTrio]:
    trio = start_pd(workdir, **kwargs)
    try:
        yield trio
    finally:
        for engine in trio.all():
            stop_engine(engine)


# ---- a third customer's honest traffic ------------------------------------------------------------

CUSTOMER_MARKER_PREFIX = "CUSTOMER-SECRET-"  # not kvpreflight's canary shape (KVPF-...)


class BackgroundTraffic:
    """Honest traffic of a third customer, sent to `url` (an engine or a router) while a check
    runs, so that freed and cached pages hold someone else's text, as they do in production.

    Each prompt is this customer's marker (`CUSTOMER-SECRET-<hex>`) repeated, with a request number
    in front so no two prompts share a cached prefix (each one takes fresh pages). Sent one at a
    time with `interval_s` between, not streamed, with no cache_salt (another customer of the
    deployment). `answers` keeps the texts that came back; `sent` and `failed` count requests.

        with BackgroundTraffic(engine.url) as traffic:
            ... run the check ...
        assert traffic.marker not in report_text
    """

    def __init__(self, url: str, *, prompt_tokens: int = 384, max_new_tokens: int = 8, interval_s: float = 0.1,
                 timeout_s: float = 30.0, marker: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.marker = marker or f"{CUSTOMER_MARKER_PREFIX}{secrets.token_hex(4)}"
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.sent = 0
        self.failed = 0
        self.answers: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="background-traffic", daemon=True)

    def prompt(self, number: int) -> str:
        """The customer's prompt number `number`: exactly `prompt_tokens` bytes (one token each)."""
        head = f"order {number:06d}: "
        body = (f"{self.marker} " * (self.prompt_tokens // (len(self.marker) + 1) + 2))
        return (head + body)[: self.prompt_tokens]

    def send(self) -> str | None:
        """One request, answered or not: the answer's text, None when it failed."""
        body = json.dumps({"text": self.prompt(self.sent),
                           "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0}}).encode()
        self.sent += 1
        request = urllib.request.Request(self.url + "/generate", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                text = json.loads(resp.read()).get("text")
        except (OSError, ValueError):
            self.failed += 1
            return None
        if isinstance(text, str):
            self.answers.append(text)
            return text
        self.failed += 1
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.send()
            self._stop.wait(self.interval_s)

    def start(self) -> BackgroundTraffic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 5)

    def __enter__(self) -> BackgroundTraffic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
