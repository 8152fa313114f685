"""The demo's stability over several boots in a row (issue 24 moved it here from the test suite):
the fixed deployment must pass and the timing-sensitive fault (early-free-on-cancel) must be caught
every run, fresh engines each time; optionally behind smg (`--router smg`).

    .venv/bin/python benchmarks/bench_demo_stability.py [--runs 6] [--router smg]

One JSON line per run, then a summary line; benchmarks/RESULTS.md quotes them. The test suite keeps
one run of each (tests/builtin/test_demo.py, tests/real/test_smg_router.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def demo(*args: str) -> tuple[int, dict, float]:
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "report.json"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "kvpreflight", "demo", "--format", "json", "--output", str(out),
                               "--out", str(Path(work) / "out"), *args],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        wall = time.monotonic() - started
        return proc.returncode, (json.loads(out.read_text()) if out.exists() else {}), wall


def crossed(report: dict) -> bool:
    iso = next((c for c in report.get("checks", []) if c["id"] == "tenant-isolation"), None)
    return bool(iso and iso["status"] == "fail" and iso["evidence"].get("crossings"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--router", default=None, help="demo --router (e.g. smg)")
    ns = parser.parse_args()
    extra = ("--router", ns.router) if ns.router else ()
    good = 0
    for run in range(ns.runs):
        fixed_code, fixed, fixed_s = demo(*extra)
        fault_code, faulty, fault_s = demo(*extra, "--fault", "early-free-on-cancel")
        ok = fixed_code == 0 and fault_code == 1 and crossed(faulty)
        good += ok
        print(json.dumps({"run": run, "fixed_exit": fixed_code, "fixed_s": round(fixed_s, 1), "fault_exit": fault_code,
                          "fault_caught": crossed(faulty), "fault_s": round(fault_s, 1), "ok": ok}), flush=True)
    print(json.dumps({"runs": ns.runs, "stable": good, "router": ns.router or "builtin"}))
    return 0 if good == ns.runs else 1


if __name__ == "__main__":
    sys.exit(main())
