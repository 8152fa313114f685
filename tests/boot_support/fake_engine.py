"""A stand-in engine for launcher tests: prints start-up lines, serves GET /health on 127.0.0.1.

    python fake_engine.py PORT MODE [SECONDS]

MODE: ok | crash | never-ready | ignore-term | family | slow (SECONDS before listening) |
      proxy (ok, and GET /health answers only if UPSTREAM env URL's /health does).
"""

import http.server
import os
import signal
import sys
import time
import urllib.request

port, mode = int(sys.argv[1]), sys.argv[2]
print(f"fake engine {mode} loading weights", flush=True)

if mode == "crash":
    print(f"server_args=ServerArgs(port={port}, api_key='sk-live-123')", flush=True)
    print("RuntimeError: CUDA out of memory (fake)", file=sys.stderr, flush=True)
    sys.exit(7)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "slow":
    for i in range(int(float(sys.argv[3]) * 4)):
        print(f"loading shard {i}", flush=True)
        time.sleep(0.25)
if mode == "family":
    for escape in (False, True):
        child = os.fork()
        if child == 0:
            if escape:
                os.setsid()  # leaves the engine's process group
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
            os._exit(0)
        print(f"child pid {child}{' (left the group)' if escape else ''}", flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        status = 503 if mode == "never-ready" else 200
        if mode == "proxy":
            try:
                urllib.request.urlopen(os.environ["UPSTREAM"] + "/health", timeout=2).close()
            except Exception:
                status = 502
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", port), Handler)
print(f"listening on 127.0.0.1:{port} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
server.serve_forever()
