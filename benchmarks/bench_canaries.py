"""The echo model's power as a positive control (issue 24 moved the 100-canary figure here from the
test suite): how many of N fresh tenant canaries, 100 to 793 tokens, a running engine or router
repeats. The tests keep 20 of 20 (tests/real/).

    source ~/.cache/kvpreflight/engines.env
    .venv/bin/python benchmarks/bench_canaries.py --url http://127.0.0.1:PORT [--engine-url URL] [--count 100] [--concurrency 1]

`--engine-url`: the engine behind --url when --url is a router (a router does not tokenize). One JSON
line; benchmarks/RESULTS.md quotes the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from support.echo_canaries import echoed_canaries  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--engine-url", default=None)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=1)
    ns = parser.parse_args()
    started = time.monotonic()
    echoed = echoed_canaries(ns.url, ns.count, engine_url=ns.engine_url, concurrency=ns.concurrency)
    print(json.dumps({"url": ns.url, "count": ns.count, "echoed": echoed, "wall_s": round(time.monotonic() - started, 1)}))
    return 0 if echoed >= ns.count - 1 else 1


if __name__ == "__main__":
    sys.exit(main())
