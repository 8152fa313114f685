"""Live SGLang 0.5.23 on CPU: the shipped examples/specs/sglang-*-cpu.yaml booted as a user runs
them (from a folder holding ./models/echo/hf, the SGLang venv's bin first on PATH, then the router's),
and what the live engine answers, measured: boot time, resident memory, exact echo answers on
/generate and /v1/completions. Shared by tests/real/test_sglang_live.py and by hand
(``python tests/support/sglang_live.py SPEC`` from the repository, see ``main``)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import requests

from kvpreflight.boot import BootedDeployment, BootedEngine, boot_deployment, load_spec

SPECS = Path(__file__).resolve().parents[2] / "examples" / "specs"
# scripts/make_echo_model.py: the echo model's one head copies the token this many positions back
# (len("KVPF-TENANTA-") + 24 hex + a space), one byte a token.
ECHO_PERIOD = 38
MODEL = "tiny-llama"  # every SGLang spec's --served-model-name
WORKERS_TIMEOUT_S = 60.0


@dataclass
class Live:
    """One booted deployment, as the boot library started it, with what was measured on it."""

    deployment: BootedDeployment
    boot_s: float
    progress: str = ""  # what the boot library said
    rss_mib: dict[str, float] = field(default_factory=dict)  # engine name -> its processes' RSS

    def engine(self, name: str) -> BootedEngine:
        return self.deployment.engine(name)

    @property
    def entry(self) -> str:
        return self.deployment.entry_url

    def log(self, name: str) -> str:
        return Path(self.engine(name).log_path).read_text(errors="replace")

    def log_args(self) -> list[str]:
        """`--log URL=PATH` for every engine: kvpreflight reads SGLang's pool lines there."""
        return [arg for e in self.deployment.engines if e.role != "router" for arg in ("--log", f"{e.url}={e.log_path}")]


def echo_continuation(prompt: str, count: int) -> str:
    """What the echo model answers to `prompt` (one byte a token, at least ECHO_PERIOD long) for
    `count` new tokens: each token repeats the one ECHO_PERIOD positions before it."""
    assert len(prompt) >= ECHO_PERIOD and prompt.isascii()
    text = list(prompt)
    for _ in range(count):
        text.append(text[-ECHO_PERIOD])
    return "".join(text[len(prompt):])


def rss_mib(engine: BootedEngine) -> float:
    total = 0
    for pid in engine.process_ids():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total / 2**20


@contextlib.contextmanager
def booted(spec_name: str, workdir: Path, echo_hf_model: Path, bins: list[str],
           extra_env: dict[str, str] | None = None, engine_args: dict[str, list[str]] | None = None,
           router_workers: int | None = 2) -> Iterator[Live]:
    """Boot examples/specs/`spec_name` from `workdir` (./models/echo/hf there links the echo model),
    with `bins` first on PATH, and stop every engine on leaving (by PID, as the boot library does).
    `engine_args`: arguments added to an engine's command, by engine name. `router_workers`: how
    many workers the router's /workers must list before the deployment counts as up (None: a
    router without that list, whose spec's ready_url says when it serves)."""
    (workdir / "models" / "echo").mkdir(parents=True, exist_ok=True)
    link = workdir / "models" / "echo" / "hf"
    if not link.exists():
        link.symlink_to(echo_hf_model)
    cache = workdir / "cache"
    env = {
        "PATH": os.pathsep.join([*bins, os.environ["PATH"]]),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "OUTLINES_CACHE_DIR": str(cache / "outlines"),
        "HF_HOME": str(cache / "hf"),
        **(extra_env or {}),
    }
    spec = load_spec(SPECS / spec_name)
    spec = replace(spec, engines=tuple(
        replace(e, cwd=str(workdir), env=types.MappingProxyType({**e.env, **env}),
                command=(*e.command, *(engine_args or {}).get(e.name, [])))
        for e in spec.engines))
    progress = _TeeToStderr()
    started = time.monotonic()
    with boot_deployment(spec, workdir / "logs", stderr=progress) as deployment:
        live = Live(deployment, time.monotonic() - started)
        router = next((e for e in deployment.engines if e.role == "router"), None)
        if router is not None and router_workers is not None:
            wait_for_workers(router.url, router_workers)
        live.rss_mib = {e.name: rss_mib(e) for e in deployment.engines}
        print(f"{spec.deployment}: booted in {live.boot_s:.0f} s, RSS "
              + ", ".join(f"{k} {v:.0f} MiB" for k, v in live.rss_mib.items()), file=sys.stderr)
        try:
            yield live
        finally:
            live.progress = progress.getvalue()


class _TeeToStderr(io.StringIO):
    def write(self, text: str) -> int:
        sys.stderr.write(text)
        return super().write(text)


def wait_for_workers(router_url: str, count: int, timeout_s: float = WORKERS_TIMEOUT_S) -> list[dict[str, Any]]:
    """The router's /workers once it lists `count` workers (smg answers /health 200 a few seconds
    before its workers are registered)."""
    deadline = time.monotonic() + timeout_s
    workers: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException, ValueError):
            reply = requests.get(f"{router_url}/workers", timeout=5)
            if reply.status_code == 200:
                body = reply.json()
                workers = body.get("workers", body) if isinstance(body, dict) else body
                if isinstance(workers, list) and len(workers) >= count:
                    return workers
        time.sleep(0.5)
    raise AssertionError(f"{router_url}/workers did not list {count} workers in {timeout_s:.0f} s: {workers}")


@dataclass(frozen=True)
class Answer:
    route: str
    status: int
    text: str | None  # the generated text, when there is one
    finish_reason: Any
    elapsed_s: float
    body: str  # the raw body, clipped
    prompt_tokens: int | None = None  # as the answer counts them

    def echoed(self, prompt: str, count: int) -> bool:
        return self.status == 200 and self.text == echo_continuation(prompt, count)


def generate(url: str, prompt: str, count: int, timeout_s: float = 120.0) -> Answer:
    """SGLang's native /generate (through a router too: it forwards /generate)."""
    started = time.monotonic()
    reply = requests.post(f"{url}/generate", timeout=timeout_s, json={
        "text": prompt, "sampling_params": {"max_new_tokens": count, "temperature": 0}})
    elapsed = time.monotonic() - started
    text, finish, prompt_tokens = None, None, None
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        data = reply.json()
        text = data.get("text")
        finish = (data.get("meta_info") or {}).get("finish_reason")
        prompt_tokens = (data.get("meta_info") or {}).get("prompt_tokens")
    return Answer("/generate", reply.status_code, text, finish, elapsed, reply.text[:2000], prompt_tokens)


def completion(url: str, prompt: str, count: int, timeout_s: float = 120.0) -> Answer:
    started = time.monotonic()
    reply = requests.post(f"{url}/v1/completions", timeout=timeout_s, json={
        "model": MODEL, "prompt": prompt, "max_tokens": count, "temperature": 0})
    elapsed = time.monotonic() - started
    text, finish, prompt_tokens = None, None, None
    with contextlib.suppress(ValueError, AttributeError, TypeError, IndexError, KeyError):
        data = reply.json()
        text, finish = data["choices"][0].get("text"), data["choices"][0].get("finish_reason")
        prompt_tokens = (data.get("usage") or {}).get("prompt_tokens")
    return Answer("/v1/completions", reply.status_code, text, finish, elapsed, reply.text[:2000], prompt_tokens)


# Prompts for the exact-echo probes: ASCII, longer than the echo period, not periodic themselves.
ECHO_PROMPTS = (
    "The quick brown fox jumps over the lazy dog while the KV cache holds every token of it. ",
    "tenant a: invoice 4471, due 2026-12-31, amount 1,234.56 EUR; tenant b must never read this line. ",
    "".join(f"{i:03d}|" for i in range(120)),  # 480 tokens: several pages of KV to move
)


def echo_probes(url: str, count: int = 48) -> list[Answer]:
    """Each ECHO_PROMPTS prompt on /generate and on /v1/completions through `url`."""
    answers = []
    for prompt in ECHO_PROMPTS:
        answers.append(generate(url, prompt, count))
        answers.append(completion(url, prompt, count))
    return answers


def main() -> int:
    """By hand: boot one spec, send the echo probes, print what came back; stop it."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--echo-model", required=True)
    parser.add_argument("--bin", action="append", default=[])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvpf-sglang-") as tmp, \
            booted(args.spec, Path(tmp), Path(args.echo_model), args.bin) as live:
        for answer in echo_probes(live.entry):
            print(answer.route, answer.status, f"{answer.elapsed_s:.2f}s", answer.finish_reason, repr(answer.text)[:80])
    return 0


if __name__ == "__main__":
    sys.exit(main())
