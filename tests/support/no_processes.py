"""What the unit tier patches so that no test in it can start a process (tests/unit/conftest.py)."""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from pathlib import Path

SPAWNERS = ((subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec"), (os, "fork"), (os, "forkpty"),
            (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"), (os, "execv"), (os, "execve"))


class ProcessStarted(AssertionError):
    pass


def refuse(name: str):
    def refused(*args, **kwargs):
        what = next((a for a in args if isinstance(a, (list, tuple, bytes, str))), "?")
        raise ProcessStarted(f"the unit tier starts no process: {name}({what!r}); move the test to tests/builtin/")
    return refused


def child_pids() -> set[int]:
    """This process's children, read from /proc (zombies included: a reaped child is gone)."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            found.add(int(stat.parent.name))
    return found
