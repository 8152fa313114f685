"""Peak memory and wall time of kvpreflight's HTTP client reading bodies that are too big or never
end (issue 12: target under 100 MB, bounded in time by the timeout).

Run: .venv/bin/python benchmarks/bench_http_bounds.py [--timeout 5] [--checkout PATH]

Each case is one child process that builds an HttpClient and makes one request to a misbehaving
server run here (tests/misbehaving_http.py); its peak RSS is the kernel's (`os.wait4`), so the
server's memory is not counted. `--checkout` points the child at another kvpreflight checkout
(a "before" figure); a child still running at timeout + 30 s is killed and reported so.
Figures go to stdout, one JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from misbehaving_http import chunked, drip_body, fixed, misbehaving_server, sized  # noqa: E402

BIG = 60_000_000
CHILD = """
import sys, time
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight.errors import KvpreflightError
method, url, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
client = HttpClient(timeout_s=timeout)
start = time.monotonic()
try:
    if method == "stream":
        reply = client.post_stream(url, {}, timeout_s=timeout)
        outcome = f"{len(reply.body):,} bytes, {len(reply.frames):,} frames, timed_out={reply.timed_out}"
    else:
        outcome = f"{len(client.get(url).body):,} bytes read"
except KvpreflightError as exc:
    outcome = f"{type(exc).__name__}: {exc}"
print(f"{time.monotonic() - start:.2f}|{outcome}")
"""

CASES = [
    ("baseline: an honest 2 KB JSON reply", "get", fixed(b"{}" * 1000)),
    ("60 MB /metrics, Content-Length declared", "get", sized(BIG)),
    ("60 MB /metrics, chunked (no length)", "get", chunked(BIG)),
    ("endless chunked /metrics, as fast as read", "get", chunked(None)),
    ("endless /metrics, a byte every 0.5 s", "get", drip_body(0.5)),
    ("endless event stream of 300-byte frames", "stream",
     chunked(None, "text/event-stream", (b'data: {"text": "' + b"y" * 280 + b'"}\n\n') * 200)),
]


def run_case(method: str, url: str, timeout_s: float, checkout: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", CHILD, method, url, str(timeout_s)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=checkout, text=True)
    # Read to EOF and reap with wait4 ourselves (Popen.wait would reap it and lose its rusage).
    killer = threading.Timer(timeout_s + 30, child.send_signal, (signal.SIGKILL,))
    killer.start()
    out = child.stdout.read()  # type: ignore[union-attr]
    killer.cancel()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    killed = child.returncode == -signal.SIGKILL
    wall = time.monotonic() - start
    elapsed, _, outcome = out.strip().rpartition("\n")[2].partition("|")
    return {"peak_rss_mb": round(usage.ru_maxrss * 1024 / 1e6, 1), "request_s": float(elapsed) if elapsed else None,
            "child_wall_s": round(wall, 2), "outcome": f"killed at {timeout_s + 30:g} s, still reading" if killed else outcome}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=5.0, help="the client's timeout_s (default 5)")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the kvpreflight checkout to measure (default this one)")
    args = parser.parse_args()
    for name, method, behaviour in CASES:
        with misbehaving_server(behaviour) as url:
            figures = run_case(method, f"{url}/metrics", args.timeout, args.checkout)
        print(json.dumps({"case": name, "timeout_s": args.timeout, **figures}), flush=True)


if __name__ == "__main__":
    main()
