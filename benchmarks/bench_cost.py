"""What a default `check` costs the engine, by context (issue 14): the builtin unified engine
(pool 2x the context, metrics on) at each context, with its prefix cache on and off
(`--disable-radix-cache`). Per run: requests, prompt tokens submitted and really prefilled (from
the engine's counters) as context-equivalents, and wall time. A cost that grows linearly in the
context has constant context-equivalents.

    .venv/bin/python benchmarks/bench_cost.py [--contexts 8192,32768,131072]

Figures go to stdout as JSON lines; benchmarks/RESULTS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]
from support.builtin_testbed import unified_engine  # noqa: E402


def one(context: int, cache: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as workdir, unified_engine(
            Path(workdir), context_length=context, pool_tokens=2 * context,
            extra_args=[] if cache else ["--disable-radix-cache"], wait_s=300) as engine:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url, "--format", "json",
                               "--timeout", "60"], capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - start
    cost = json.loads(proc.stdout)["cost"]
    return {"bench": "check cost", "context": context, "prefix_cache": cache, "exit_code": proc.returncode,
            "requests": cost["requests"], "prompt_tokens_submitted": cost["prompt_tokens_submitted"],
            "context_equivalents_submitted": cost["context_equivalents_submitted"],
            "prefilled_tokens": cost["prefilled_tokens"], "context_equivalents_prefilled": cost["context_equivalents_prefilled"],
            "prefilled_measured": cost["prefilled_measured"], "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", default="8192,32768,131072")
    args = parser.parse_args()
    for context in (int(c) for c in args.contexts.split(",")):
        for cache in (True, False):
            print(json.dumps(one(context, cache)), flush=True)


if __name__ == "__main__":
    main()
