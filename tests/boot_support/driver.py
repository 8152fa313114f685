"""Runs the launcher in a process of its own, so a test can send it SIGTERM or SIGINT.

    python driver.py SPEC LOG_DIR

Prints "READY <pid> <pid> ..." (every engine process) once booted, then waits for a signal.
"""

import signal
import sys
import time

from kvpreflight.boot import boot_deployment, load_spec

# A shell without job control starts background jobs with SIGINT ignored, and Python then installs
# no KeyboardInterrupt handler: restore it, so the tests' Ctrl-C reaches the launcher however the
# suite itself was started.
signal.signal(signal.SIGINT, signal.default_int_handler)

try:
    with boot_deployment(load_spec(sys.argv[1]), sys.argv[2], stop_grace_s=3) as deployment:
        pids = sorted(set().union(*(e.process_ids() for e in deployment.engines)))
        print("READY " + " ".join(map(str, pids)), flush=True)
        while True:
            time.sleep(0.1)
except KeyboardInterrupt:  # what kvpreflight._internal.commands._run does with Ctrl-C
    sys.exit(130)
