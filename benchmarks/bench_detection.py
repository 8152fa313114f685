"""Does a cheaper plan still catch a racy leak (issue 14)? A builtin prefill/decode/router trio
whose decode has fault early-free-on-cancel firing at each client disconnect only with probability
--probability (KVPREFLIGHT_BUILTIN_FAULT_PROBABILITY), checked --runs times, fresh engines each run.
A run detects the leak when tenant-isolation fails with one tenant's answer carrying the other
tenant's canary. The engines always come from this tree; the `kvpreflight check` that probes them
comes from --checkout (another tree, e.g. a `git worktree` of main for the old plan; default: this
tree), so the old and the new plan face the same engines.

    .venv/bin/python benchmarks/bench_detection.py [--runs 20] [--probability 0.3] [--checkout DIR]

One JSON line per run, then a summary line; benchmarks/RESULTS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kvpreflight.builtin_engine.config import FAULT_PROBABILITY_ENV  # noqa: E402
from kvpreflight.builtin_engine.testbed import pd_trio  # noqa: E402

FAULT = "early-free-on-cancel"
TRANSFER_DELAY_MS = 6  # as the demo: a paced link, so a disconnect can land mid-transfer


def detected(report: dict) -> tuple[bool, list[str]]:
    """Whether some tenant's answer carried the other tenant's canary, and in which scenarios."""
    iso = next((c for c in report.get("checks", []) if c["id"] == "tenant-isolation"), None)
    if iso is None or iso["status"] != "fail":
        return False, []
    canaries = iso["evidence"]["canaries"]
    other = {"a": canaries["b"], "b": canaries["a"]}
    crossed = [c for c in iso["evidence"].get("crossings", [])
               if any(m.split(" ")[0] == other[c["tenant"]] for m in c["foreign_markers"])]
    return bool(crossed), sorted({c["scenario"] for c in crossed})


def one(checkout: Path, context: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as workdir, pd_trio(
            Path(workdir), context_length=context, prefill_pool=2 * context, decode_pool=2 * context,
            decode_faults=[FAULT], prefill_args=["--transfer-delay-ms", str(TRANSFER_DELAY_MS)],
            wait_s=600) as trio:  # a loaded machine boots slowly
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "kvpreflight", "check", "--endpoint", f"prefill={trio.prefill.url}",
             "--endpoint", f"decode={trio.decode.url}", "--entry", trio.router.url, "--context-length", str(context),
             "--format", "json", "--timeout", "60"],
            capture_output=True, text=True, timeout=1800, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)})
        wall = time.monotonic() - start
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    caught, scenarios = detected(report)
    cost = report.get("cost") or {}
    return {"exit_code": proc.returncode, "detected": caught, "scenarios": scenarios, "wall_s": round(wall, 1),
            "context_equivalents_submitted": cost.get("context_equivalents_submitted"),
            "context_equivalents_prefilled": cost.get("context_equivalents_prefilled")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--probability", type=float, default=0.3)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the tree whose `kvpreflight check` probes")
    parser.add_argument("--label", default="", help="what --checkout is (default: its git commit)")
    args = parser.parse_args()
    os.environ[FAULT_PROBABILITY_ENV] = str(args.probability)  # the engines inherit it
    checkout = args.checkout.resolve()
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or args.label
    hits = 0
    for run in range(args.runs):
        result = one(checkout, args.context)
        hits += bool(result["detected"])
        print(json.dumps({"run": run + 1, **result}), flush=True)
    print(json.dumps({"bench": "racy-leak detection", "fault": FAULT, "probability": args.probability,
                      "context": args.context, "checkout": str(checkout), "commit": args.label or commit,
                      "runs": args.runs, "detected": hits, "rate": round(hits / args.runs, 2)}), flush=True)


if __name__ == "__main__":
    main()
