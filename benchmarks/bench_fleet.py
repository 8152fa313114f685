"""Fleet benchmark (issue 8). Run: .venv/bin/python benchmarks/bench_fleet.py [--deployments 8]

Starts builtin prefill/decode/router deployments (127.0.0.1, stopped by PID), fresh ones for
every timed run (a check leaves an engine's state changed), and times `kvpreflight fleet` in attach
mode over them:
1. one deployment alone (the reference wall time);
2. all N with --parallel 1;
3. all N with --parallel N (goal: <= 2x the single deployment's wall time).
For each: wall time, the driver's peak RSS (os.wait4 on the fleet process; attach checks run in
its threads, so this is all the client-side memory), and the verdict counts, which must agree.
Figures go to stdout as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests")]  # tests/support: the builtin testbed
from support.builtin_testbed import start_pd, stop_engine  # noqa: E402


@contextmanager
def deployments(work: Path, n: int, ctx: int):
    trios = []
    try:
        started = time.perf_counter()
        for i in range(n):
            trios.append(start_pd(work / f"d{i}", context_length=ctx, prefill_pool=2 * ctx, decode_pool=2 * ctx, page_log=False))
        print(json.dumps({"bench": "fleet-setup", "deployments": n, "engine_processes": 3 * n,
                          "boot_s": round(time.perf_counter() - started, 1)}), flush=True)
        yield trios
    finally:
        for trio in trios:
            for engine in trio.all():
                stop_engine(engine)


def run_fleet(inventory: Path, parallel: int, out: Path) -> dict:
    argv = [sys.executable, "-m", "kvpreflight", "fleet", str(inventory), "--parallel", str(parallel),
            "--format", "json", "--output", str(out)]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    report = json.loads(out.read_text())
    return {"wall_s": round(wall, 2), "driver_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "driver_cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "exit_code": proc.returncode,
            "counts": report["counts"]}


def inventory(path: Path, trios, context: int, capacity_only: bool) -> Path:
    deployments = [{"name": f"builtin-{i}", "timeout_s": 1200, "attach": {
        "endpoints": [f"prefill={t.prefill.url}", f"decode={t.decode.url}"], "entry": t.router.url,
        "context_length": context, "capacity_only": capacity_only}} for i, t in enumerate(trios)]
    path.write_text(json.dumps({"fleet": "bench", "deployments": deployments}))
    return path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deployments", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=None, help="default: --deployments")
    parser.add_argument("--context-length", type=int, default=1024)
    parser.add_argument("--capacity-only", action="store_true", help="read-only checks (no probes)")
    parser.add_argument("--skip-serial", action="store_true", help="skip the --parallel 1 run (N x the single run)")
    args = parser.parse_args()
    n, ctx = args.deployments, args.context_length
    parallel = args.parallel or n
    work = Path(tempfile.mkdtemp(prefix="kvpreflight-bench-fleet-"))
    with deployments(work / "single", 1, ctx) as trios:
        single = run_fleet(inventory(work / "one.yaml", trios, ctx, args.capacity_only), 1, work / "one.json")
    print(json.dumps({"bench": "fleet-single", **single}), flush=True)
    serial = None
    if not args.skip_serial:
        with deployments(work / "serial", n, ctx) as trios:
            serial = run_fleet(inventory(work / "serial.yaml", trios, ctx, args.capacity_only), 1, work / "serial.json")
        print(json.dumps({"bench": "fleet-parallel-1", "deployments": n, **serial}), flush=True)
    with deployments(work / "wide", n, ctx) as trios:
        wide = run_fleet(inventory(work / "wide.yaml", trios, ctx, args.capacity_only), parallel, work / "wide.json")
    print(json.dumps({"bench": f"fleet-parallel-{parallel}", "deployments": n, **wide,
                      **({"speedup_vs_parallel_1": round(serial["wall_s"] / wide["wall_s"], 2),
                          "verdicts_agree_with_parallel_1": serial["counts"] == wide["counts"]} if serial else {}),
                      "vs_single": round(wide["wall_s"] / single["wall_s"], 2), "goal_vs_single": 2.0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
