"""The process table, read from /proc (Linux): who belongs to an engine, and who is still alive.

An engine starts in its own session and process group, but a child may call setsid() and leave
the group; descendants are therefore collected by parent links too, before anything is signalled
(once a parent dies its children are re-parented and the link is gone). Zombies count as gone:
they hold no port and no GPU memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvpreflight._internal.files import read_system


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str  # R, S, D, Z, T, ...


def read_table() -> dict[int, ProcInfo]:
    table: dict[int, ProcInfo] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        info = read_one(int(entry))
        if info is not None:
            table[info.pid] = info
    return table


def read_one(pid: int) -> ProcInfo | None:
    raw = read_system(f"/proc/{pid}/stat")
    if raw is None:
        return None
    # "pid (comm) state ppid pgrp ..."; comm may contain spaces and parentheses.
    rest = raw[raw.rfind(")") + 2:].split()
    if len(rest) < 3:
        return None
    return ProcInfo(pid=pid, state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]))


def family(pid: int, pgid: int, table: dict[int, ProcInfo] | None = None) -> set[int]:
    """`pid`, every live member of process group `pgid`, and every live descendant of either."""
    table = read_table() if table is None else table
    members = {p for p, info in table.items() if info.pgid == pgid and info.state != "Z"}
    if pid in table and table[pid].state != "Z":
        members.add(pid)
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    todo = list(members | {pid})
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in members and table[child].state != "Z":
                members.add(child)
                todo.append(child)
    return members


def alive(pid: int) -> bool:
    info = read_one(pid)
    return info is not None and info.state != "Z"
