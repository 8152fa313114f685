"""The real vLLM prefill/decode pair of examples/specs/vllm-pd-nixl.yaml at a larger context (issue
13: the 4,096-context run is a benchmark, not a test). The spec is booted as shipped except for the
context (`--max-model-len`, `context_length`) and the pool, scaled with it so it stays 2.25x the
context; each engine gets one plain request first (docs/FINDINGS.md: a decode whose first request
brings transferred KV died on the 2-core test machine); then `kvpreflight check --entry ROUTER
--allow-disruptive` as a user runs it. Prints one JSON line: exit code, wall time, each check's
status and the cost block.

    source ~/.cache/kvpreflight/engines.env    # scripts/setup_engines.sh writes it
    .venv/bin/python benchmarks/bench_vllm_pd.py [--context 4096] [--connector nixl|mooncake] [--lease S]

Needs the vLLM venv (KVPREFLIGHT_VLLM_PYTHON) with nixl and vllm-router, and the echo model
(KVPREFLIGHT_ECHO_MODEL); `--connector mooncake` boots examples/specs/vllm-pd-mooncake-cpu.yaml
instead, with the Mooncake venv's python (KVPREFLIGHT_MOONCAKE_PYTHON). benchmarks/RESULTS.md
quotes the figures. `--lease S` sets the NIXL prefill's `kv_lease_duration` (the spec's is 30 s):
with a lease of a few seconds the check's late-decode scenario holds a decode leg past it (issue 27).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import replace
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvpreflight.boot import boot_deployment, load_spec  # noqa: E402

SPECS = {"nixl": Path(__file__).resolve().parents[1] / "examples" / "specs" / "vllm-pd-nixl.yaml",
         "mooncake": Path(__file__).resolve().parents[1] / "examples" / "specs" / "vllm-pd-mooncake-cpu.yaml"}
PYTHONS = {"nixl": "KVPREFLIGHT_VLLM_PYTHON", "mooncake": "KVPREFLIGHT_MOONCAKE_PYTHON"}
SPEC_CONTEXT = 1024
# Each engine's pool scales with the context from the spec's own (the decode's 18 blocks of 128
# tokens at 512 bytes per token, 2.25x the context; the prefill's 34, room for abandoned KV).


LEASE_JSON = re.compile(r'"kv_lease_duration":\d+')


def scaled(argv: tuple[str, ...], context: int, lease_s: int | None = None) -> tuple[str, ...]:
    out = [LEASE_JSON.sub(f'"kv_lease_duration":{lease_s}', a) for a in argv] if lease_s is not None else list(argv)
    pool = int(out[out.index("--kv-cache-memory-bytes") + 1]) if "--kv-cache-memory-bytes" in out else 0
    for flag, value in (("--max-model-len", context), ("--kv-cache-memory-bytes", pool * context // SPEC_CONTEXT)):
        if flag in out:
            out[out.index(flag) + 1] = str(value)
    return tuple(out)


def timed(node: object, name: str | None = None) -> list[tuple[float, str | None]]:
    """Every (elapsed_s, the request's name) in a JSON report, wherever its evidence holds one."""
    if isinstance(node, dict):
        here = node.get("name") or node.get("request") or node.get("probe") or name
        found = [(float(node["elapsed_s"]), here)] if isinstance(node.get("elapsed_s"), (int, float)) else []
        return found + [t for v in node.values() for t in timed(v, here if isinstance(here, str) else name)]
    if isinstance(node, list):
        return [t for v in node for t in timed(v, name)]
    return []


def engine_env(workdir: Path, rpc: str, vllm_python: str) -> dict[str, str]:
    """The examples' specs run in `workdir` with the cached echo model at models/echo/hf: link it,
    and return the environment that puts the cached vLLM and router first on PATH."""
    (workdir / "models" / "echo").mkdir(parents=True)
    (workdir / "models" / "echo" / "hf").symlink_to(Path(os.environ["KVPREFLIGHT_ECHO_MODEL"]) / "hf")
    router = os.environ["KVPREFLIGHT_VLLM_ROUTER"]
    return {"PATH": os.pathsep.join([str(Path(vllm_python).parent), str(Path(router).parent), os.environ["PATH"]]),
            "VLLM_RPC_BASE_PATH": rpc}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--connector", choices=sorted(SPECS), default="nixl")
    parser.add_argument("--lease", type=int, default=None, help="the NIXL prefill's kv_lease_duration in seconds (default: the spec's)")
    args = parser.parse_args()
    if args.lease is not None and (args.connector != "nixl" or args.lease < 1):
        parser.error("--lease S: a whole number of seconds, with --connector nixl")
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(prefix="kvpf-rpc-", dir="/tmp") as rpc:
        workdir = Path(tmp)
        env = engine_env(workdir, rpc, os.environ[PYTHONS[args.connector]])
        spec = load_spec(SPECS[args.connector])
        spec = replace(spec, context_length=args.context, engines=tuple(
            replace(e, command=scaled(e.command, args.context, args.lease), cwd=str(workdir),
                    env=types.MappingProxyType({**e.env, **env})) for e in spec.engines))
        booted = time.monotonic()
        with boot_deployment(spec, workdir / "logs", stderr=sys.stderr) as deployment:
            boot_s = time.monotonic() - booted
            for name in ("prefill", "decode"):
                url = deployment.engine(name).url
                requests.post(f"{url}/v1/completions", json={"model": "tiny-llama", "prompt": "warm up", "max_tokens": 2},
                              timeout=120).raise_for_status()
            logs = [arg for e in deployment.engines for arg in ("--log", f"{e.url}={e.log_path}")]
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--format", "json", "--entry",
                                   deployment.engine("router").url, "--allow-disruptive", *logs],
                                  capture_output=True, text=True, timeout=3600)
            wall = time.monotonic() - started
    report = json.loads(proc.stdout)
    iso = next((c for c in report["checks"] if c["id"] == "tenant-isolation"), {})
    late = next((sc for sc in iso.get("evidence", {}).get("scenarios", []) if sc["scenario"] == "late-decode"), {})
    crossings = [c["request"] for c in iso.get("evidence", {}).get("crossings", [])]
    longest = max(timed(report), default=(None, None))
    print(json.dumps({"bench": "vllm-pd check", "connector": args.connector, "context": args.context, "lease_s": args.lease,
                      "exit_code": proc.returncode,
                      "boot_s": round(boot_s), "check_wall_s": round(wall), "cost": report["cost"],
                      # the longest any request of the check took, answered or not: what the lease
                      # must outlast with room (issue 27, item 4), beside which request it was
                      "longest_request": {"elapsed_s": longest[0], "request": longest[1]},
                      "late_decode": late.get("occurrence") or late.get("not_probed") or late.get("skipped"), "crossings": crossings,
                      "checks": [(c["id"], c["status"], c["message"][:160]) for c in report["checks"]]}), flush=True)


if __name__ == "__main__":
    main()
