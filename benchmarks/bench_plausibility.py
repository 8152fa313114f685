"""No false fail from `prompt-integrity`'s plausibility rule on real engines (issue 44): boot unified
vLLM (examples/specs/vllm-single.yaml) and the vLLM prefill/decode pair behind vllm-router
(examples/specs/vllm-pd-nixl.yaml) as shipped, run the default `check` RUNS times against each, and
print one JSON line per check and one summary line per deployment.

Each near-limit answer the rule looks at is reported with its time to first token, the fastest
prefill the run showed (and which request showed it), the time that speed needs for the tokens it
computed, and the headroom: first token x MARGIN / needed. Below 1.0 the rule would call an answer
impossible; it judges only where the prediction is MIN_JUDGED_S or more, so the headroom is what
says how near an honest answer came to the line even where it was not judged.

    source ~/.cache/kvpreflight/engines.env    # scripts/setup_engines.sh writes it
    .venv/bin/python benchmarks/bench_plausibility.py [--runs 10] [--deployment unified|pd|both]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench_vllm_pd import engine_env  # noqa: E402  (benchmarks/ is the script's folder)

from kvpreflight._internal.checks import plausibility  # noqa: E402
from kvpreflight.boot import boot_deployment, load_spec  # noqa: E402

SPECS = {"unified": ROOT / "examples" / "specs" / "vllm-single.yaml", "pd": ROOT / "examples" / "specs" / "vllm-pd-nixl.yaml"}


@contextmanager
def booted(kind: str) -> Iterator[tuple[list[str], float]]:
    """The deployment as shipped, with the cached echo model; yields the check's target arguments."""
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(prefix="kvpf-rpc-", dir="/tmp") as rpc:
        workdir = Path(tmp)
        env = engine_env(workdir, rpc, os.environ["KVPREFLIGHT_VLLM_PYTHON"])
        spec = load_spec(SPECS[kind])
        spec = replace(spec, engines=tuple(replace(e, cwd=str(workdir), env=types.MappingProxyType({**e.env, **env}))
                                           for e in spec.engines))
        started = time.monotonic()
        with boot_deployment(spec, workdir / "logs", stderr=sys.stderr) as deployment:
            boot_s = time.monotonic() - started
            workers = [e for e in deployment.engines if e.name != "router"]
            if kind == "pd":  # a decode whose first request brings transferred KV died on 2 cores (docs/FINDINGS.md)
                for e in workers:
                    requests.post(f"{e.url}/v1/completions", json={"model": "tiny-llama", "prompt": "warm up", "max_tokens": 2},
                                  timeout=120).raise_for_status()
                target = ["--entry", deployment.engine("router").url]
            else:
                target = ["--endpoint", workers[0].url]
            yield [*target, *(a for e in workers for a in ("--log", f"{e.url}={e.log_path}"))], boot_s


def one_check(kind: str, run: int, target: list[str]) -> dict:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--format", "json", *target],
                          capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    report = json.loads(proc.stdout)
    integrity = next(c for c in report["checks"] if c["id"] == "prompt-integrity")
    answers = []
    for j in integrity.get("evidence", {}).get("plausibility", []):
        needs = j.get("needs_at_least_s")
        answers.append({**j, "judged": needs is not None and needs >= plausibility.MIN_JUDGED_S,
                        "headroom": None if not needs else round(j["first_token_s"] * plausibility.MARGIN / needs, 2)})
    return {"bench": "plausibility", "deployment": kind, "run": run, "exit_code": proc.returncode, "wall_s": round(wall, 1),
            "prompt_integrity": integrity["status"],
            "not_passed": {c["id"]: c["status"] for c in report["checks"] if c["status"] not in ("pass", "skip")},
            "answers": answers}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--deployment", choices=["unified", "pd", "both"], default="both")
    args = parser.parse_args()
    for kind in (["unified", "pd"] if args.deployment == "both" else [args.deployment]):
        rows = []
        with booted(kind) as (target, boot_s):
            for run in range(1, args.runs + 1):
                rows.append(one_check(kind, run, target))
                print(json.dumps(rows[-1]), flush=True)
        answers = [a for r in rows for a in r["answers"]]
        headrooms = [a["headroom"] for a in answers if a["headroom"] is not None]
        print(json.dumps({"bench": "plausibility summary", "deployment": kind, "checks": len(rows), "boot_s": round(boot_s),
                          "exit_codes": sorted({r["exit_code"] for r in rows}),
                          "prompt_integrity": sorted({r["prompt_integrity"] for r in rows}),
                          "not_passed": sorted({f"{k}={v}" for r in rows for k, v in r["not_passed"].items()}),
                          "answers_seen": len(answers), "answers_judged": sum(a["judged"] for a in answers),
                          "impossible": sum(bool(a["impossible"]) for a in answers),
                          "fastest_prefill_tokens_per_second": max((a["fastest_prefill_tokens_per_second"] or 0 for a in answers),
                                                                   default=None),
                          "headroom_min": min(headrooms, default=None),
                          "headroom_median": sorted(headrooms)[len(headrooms) // 2] if headrooms else None,
                          "margin": plausibility.MARGIN, "min_judged_s": plausibility.MIN_JUDGED_S}), flush=True)


if __name__ == "__main__":
    main()
