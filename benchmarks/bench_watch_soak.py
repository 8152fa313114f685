"""Soak: `kvpreflight watch`'s loop for many rounds at a short interval against a running builtin
engine (started here on 127.0.0.1, stopped by PID), in this process, as `kvpreflight watch` runs
it. Samples RSS and open file descriptors every `--every` rounds: they must stay flat. Also counts
what it sent per hour against the budget it states, and checks that `--max-tokens-per-hour` holds.

    .venv/bin/python benchmarks/bench_watch_soak.py [--rounds 1000] [--interval 0.05] [--role unified|pd]

One JSON line; benchmarks/RESULTS.md quotes the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests/support: the builtin testbed

from support.builtin_testbed import pd_trio, unified_engine  # noqa: E402

from kvpreflight._internal.watch.budget import HOUR_S, BudgetPlan  # noqa: E402
from kvpreflight._internal.watch.findings import Round  # noqa: E402
from kvpreflight._internal.watch.loop import Watcher, WatchSettings  # noqa: E402
from kvpreflight._internal.watch.metrics import WatchMetrics  # noqa: E402
from kvpreflight.check_plan import CheckPlan  # noqa: E402
from kvpreflight.targets import Target  # noqa: E402


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--every", type=int, default=100, help="sample RSS and fds every N rounds")
    parser.add_argument("--role", choices=("unified", "pd"), default="unified")
    parser.add_argument("--max-tokens-per-hour", type=int, default=None)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvpreflight-soak-") as work, contextlib.ExitStack() as stack:
        if ns.role == "pd":
            trio = stack.enter_context(pd_trio(Path(work), context_length=4096, prefill_pool=8192, decode_pool=8192,
                                               page_log=False))
            plan = CheckPlan(targets=(), entry=trio.router.url, timeout_s=10)
        else:
            engine = stack.enter_context(unified_engine(Path(work), context_length=4096, pool_tokens=8192))
            plan = CheckPlan(targets=(Target(engine.url),), timeout_s=10)
        budget = BudgetPlan(interval_s=ns.interval, max_tokens_per_hour=ns.max_tokens_per_hour)
        watcher = Watcher(WatchSettings(plan=plan, budget=budget))
        metrics = WatchMetrics("soak")
        samples: list[dict[str, float]] = []
        outcomes: dict[str, int] = {}
        durations: list[float] = []
        sent = {"requests": 0, "tokens": 0}

        def emit(r: Round) -> None:
            metrics.record(r)
            metrics.text()  # as a scrape would, every round
            json.dumps(r.to_dict(), default=str)
            outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
            sent["requests"] += r.requests
            sent["tokens"] += r.prompt_tokens
            if r.number % ns.every == 0 or r.number == 1:
                samples.append({"round": r.number, "rss_kib": rss_kib(), "fds": open_fds(), "threads": threading.active_count()})

        started = time.monotonic()
        last_at = [started]

        def timed(r: Round) -> None:
            now = time.monotonic()
            durations.append(now - last_at[0])
            last_at[0] = now
            emit(r)

        watcher.run(threading.Event(), timed, interval_s=ns.interval, max_rounds=ns.rounds)
        wall = time.monotonic() - started
    after_warmup = [s for s in samples if s["round"] >= min(200, ns.rounds // 2)]
    per_hour = HOUR_S / wall
    out = {
        "rounds": ns.rounds, "interval_s": ns.interval, "role": ns.role, "wall_s": round(wall, 1),
        "round_period_s": round(statistics.median(durations), 3), "outcomes": outcomes,
        "requests_sent": sent["requests"], "prompt_tokens_sent": sent["tokens"],
        "requests_per_hour": round(sent["requests"] * per_hour), "prompt_tokens_per_hour": round(sent["tokens"] * per_hour),
        "stated_requests_per_hour": budget.requests_per_hour, "stated_prompt_tokens_per_hour": budget.canary_tokens_per_hour,
        "rss_kib_first_last": [samples[0]["rss_kib"], samples[-1]["rss_kib"]],
        "rss_kib_after_warmup_min_max": [min(s["rss_kib"] for s in after_warmup), max(s["rss_kib"] for s in after_warmup)],
        "fds_min_max": [min(s["fds"] for s in samples), max(s["fds"] for s in samples)],
        "threads_max": max(s["threads"] for s in samples),
        "samples": samples,
    }
    print(json.dumps(out))
    within = out["requests_per_hour"] <= budget.requests_per_hour and out["prompt_tokens_per_hour"] <= budget.canary_tokens_per_hour
    if ns.max_tokens_per_hour is not None:
        within = within and sent["tokens"] <= ns.max_tokens_per_hour * max(1.0, wall / HOUR_S)
    flat = out["fds_min_max"][1] - out["fds_min_max"][0] <= 4 and \
        out["rss_kib_after_warmup_min_max"][1] - out["rss_kib_after_warmup_min_max"][0] <= 8 * 1024
    all_clean = outcomes.get("clean", 0) == ns.rounds or ns.max_tokens_per_hour is not None  # a cap skips rounds
    return 0 if within and flat and all_clean else 1


if __name__ == "__main__":
    sys.exit(main())
