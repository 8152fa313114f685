"""kvpreflight's performance targets (issue 2). Run: .venv/bin/python benchmarks/bench_check.py

1. `kvpreflight --help` against a bare two-command typer app, as a ratio (target <= 1.3x).
2. Building and sending a 1,048,576-token probe: client peak RSS (target <= 250 MB) and CPU time.
3. A whole `check` against one builtin engine: wall time against the sum of its probes' round
   trips (target: kvpreflight adds <= 20%).
Figures go to stdout as JSON lines; the README quotes them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PY = sys.executable
BARE_APP = textwrap.dedent("""
    import typer
    app = typer.Typer()
    @app.command()
    def one(): pass
    @app.command()
    def two(): pass
    app()
""")


def timed(argv: list[str], runs: int = 7) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_help() -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(BARE_APP)
    bare = timed([PY, fh.name, "--help"])
    ours = timed([PY, "-m", "kvpreflight", "--help"])
    os.unlink(fh.name)
    return {"bench": "help", "kvpreflight_s": round(ours, 3), "bare_typer_s": round(bare, 3),
            "ratio": round(ours / bare, 2), "target_ratio": 1.3}


CLIENT = textwrap.dedent("""
    import resource, sys, time
    from kvpreflight._internal.engines import HttpClient
    from kvpreflight._internal.engines.sglang import SglangAdapter
    url = sys.argv[1]
    adapter = SglangAdapter(url, HttpClient(timeout_s=120))
    start = time.process_time()
    ids = adapter.token_ids(1_048_576, "kvpreflight benchmark probe text ")
    c = adapter.complete(ids, max_tokens=1, stream=False, timeout_s=120)
    cpu = time.process_time() - start
    print(c.status, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
""")


def bench_big_probe() -> dict:
    class Sink(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/tokenize":
                out = b'{"tokens": [11, 12, 13, 14, 15, 16, 17, 18], "count": 8, "max_model_len": 1048576}'
                status = 200
            else:
                n = body.count(b",") + 1
                message = (f"Input length ({n} tokens) exceeds the maximum allowed length (681274 tokens). "
                           "Use a shorter input or enable --allow-auto-truncate.")
                out = json.dumps({"error": {"message": message}}).encode()
                status = 400
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
            fh.write(CLIENT)
        out = subprocess.run([PY, fh.name, f"http://127.0.0.1:{server.server_address[1]}"], capture_output=True, text=True, check=True)
        os.unlink(fh.name)
    finally:
        server.shutdown()
        server.server_close()
    status, cpu, rss_kb = out.stdout.split()
    return {"bench": "1M-token probe", "http_status": int(status), "client_cpu_s": round(float(cpu), 2),
            "client_peak_rss_mb": round(int(rss_kb) / 1024, 1), "target_rss_mb": 250}


def bench_whole_check() -> dict:
    sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]
    from support.builtin_testbed import unified_engine

    with tempfile.TemporaryDirectory() as d, unified_engine(Path(d), context_length=8192, pool_tokens=16384) as engine:
        start = time.perf_counter()
        proc = subprocess.run([PY, "-m", "kvpreflight", "check", "--endpoint", engine.url, "--format", "json",
                               "--log", f"{engine.url}={engine.log_path}"], capture_output=True, text=True)
        wall = time.perf_counter() - start
    report = json.loads(proc.stdout)
    seen, probe_sum = set(), 0.0
    for check in report["checks"]:
        for p in check["evidence"].get("probes", []):
            if "probe" not in p or "elapsed_s" not in p:  # isolation evidence lists scenarios, not probes
                continue
            key = (p["probe"], p.get("response_sha256"), p["elapsed_s"])
            if key not in seen:
                seen.add(key)
                probe_sum += p["elapsed_s"]
    return {"bench": "whole check (builtin, 8k context)", "exit_code": proc.returncode, "wall_s": round(wall, 2),
            "sum_probe_round_trips_s": round(probe_sum, 2),
            "overhead_pct": round(100 * (wall - probe_sum) / probe_sum, 1) if probe_sum else None, "target_overhead_pct": 20}


if __name__ == "__main__":
    for bench in (bench_help, bench_big_probe, bench_whole_check):
        print(json.dumps(bench()), flush=True)
