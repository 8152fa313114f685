"""Leftover-process checks for tests that start engines through kvpreflight.

A test puts a fresh KVPREFLIGHT_TEST_TAG in the environment of what it starts; every engine, worker
and child inherits it, so /proc tells exactly which processes are this test's, whatever else runs
on the machine.
"""

from __future__ import annotations

import os

TAG_ENV = "KVPREFLIGHT_TEST_TAG"


def processes_tagged(tag: str) -> set[int]:
    """Live processes that inherited this tag in their environment."""
    found = set()
    needle = f"{TAG_ENV}={tag}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.add(int(pid))
        except OSError:
            continue
    return found
