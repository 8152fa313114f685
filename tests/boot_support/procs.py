"""The process table as `ps` shows it (independent of the launcher's own /proc reader)."""

import subprocess


def live_pids() -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,stat="], capture_output=True, text=True, check=True).stdout
    return {int(pid) for pid, stat in (line.split()[:2] for line in out.splitlines() if line.strip())
            if not stat.startswith("Z")}


def group_members(pgid: int) -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True, check=True).stdout
    rows = (line.split()[:3] for line in out.splitlines() if line.strip())
    return {int(pid) for pid, group, stat in rows if int(group) == pgid and not stat.startswith("Z")}
