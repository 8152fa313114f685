"""`python -m kvpreflight.fleet.reaper WORKER_PID`: stop a boot worker's engines if the worker is
killed outright.

A fleet worker stops its engines on exit, error, SIGTERM and its parent's death. It cannot when it
is SIGKILLed, which is what Ray does to a task's processes when their node goes away or a task is
cancelled with force; the engines run in their own sessions and would outlive it. This watcher,
in its own session, notes the worker's descendants (and their process groups) every POLL_S while
the worker lives, and when the worker is gone sends SIGTERM to whatever of them is still alive,
then SIGKILL after GRACE_S. Engines started less than POLL_S before a SIGKILL can be missed.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from kvpreflight.boot.proctree import alive, family, read_one, read_table

POLL_S = 0.25
GRACE_S = 10.0
NO_GROUP = -1  # descendants by parent links only: the worker shares its group with its parent


def watch(worker: int) -> dict[int, int]:
    """pid -> pgid of everything the worker started, until the worker is gone."""
    seen: dict[int, int] = {}
    while alive(worker):
        table = read_table()
        for pid in family(worker, NO_GROUP, table) - {worker, os.getpid()}:
            seen[pid] = table[pid].pgid
        time.sleep(POLL_S)
    return seen


def still_ours(seen: dict[int, int]) -> dict[int, int]:
    out = {}
    for pid, pgid in seen.items():
        info = read_one(pid)
        if info is not None and info.state != "Z" and info.pgid == pgid:  # same process, not a reused pid
            out[pid] = pgid
    return out


def stop(seen: dict[int, int]) -> None:
    own_group = os.getpgid(0)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = still_ours(seen)
        if not left:
            return
        leaders = {pgid for pid, pgid in left.items() if pid == pgid and pgid != own_group}
        for pgid in leaders:
            try:
                os.killpg(pgid, sig)
            except OSError:
                pass
        for pid, pgid in left.items():
            if pgid not in leaders:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and still_ours(seen):
            time.sleep(0.2)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop(watch(int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
