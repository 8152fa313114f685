"""`python -m kvpreflight.fleet.worker`: boot one deployment, check it, stop it, write an unsigned
record. Started by kvpreflight.fleet.job with the job as JSON on stdin; dies with its parent."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from kvpreflight.fleet.job import PARENT_ENV


def _die_with_parent() -> None:
    """SIGTERM when the parent (a Ray worker, a fleet thread) dies: the boot then stops its engines."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    expected = os.environ.get(PARENT_ENV)
    if expected and os.getppid() != int(expected):  # the parent died before prctl
        sys.exit(3)


def _spec(job: dict):
    from kvpreflight.boot import parse_spec

    target = job["target"]
    if job["kind"] == "builtin":
        from kvpreflight.demo import DemoSettings, demo_spec

        return demo_spec(DemoSettings(pool_ratio=target["pool_ratio"], decode_pool_ratio=target["decode_pool_ratio"],
                                      context_length=target["context_length"], faults=tuple(target["faults"])))
    import yaml

    path = target["spec_path"]
    return parse_spec(yaml.safe_load(target["spec_text"]), source=path, base_dir=os.path.dirname(path))


def _start_reaper():
    """A watcher in its own session that stops our engines if this process is SIGKILLed."""
    import subprocess

    return subprocess.Popen([sys.executable, "-m", "kvpreflight.fleet.reaper", str(os.getpid())], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sys.stderr, close_fds=True)


def main() -> int:
    _die_with_parent()
    reaper = _start_reaper()
    try:
        return _run()
    finally:  # our engines are stopped by now; the watcher is not needed (and must not outlive us)
        reaper.terminate()
        reaper.wait()


def _run() -> int:
    from kvpreflight.commands._run import error
    from kvpreflight.commands.run_check import CheckRequest, execute_booted
    from kvpreflight.errors import KvpreflightError

    job = json.load(sys.stdin)
    sys.argv = list(job["command_line"])  # what the record's command_line shows
    request = CheckRequest(
        endpoints=(), fmt="json", output=Path(job["report"]), record=Path(job["record"]), unsigned=True,
        subjects=tuple(job["subjects"]), skips=tuple(job["skips"]), reasons=tuple(job["reasons"]),
    )
    try:
        return execute_booted(_spec(job), request, log_dir=Path(job["log_dir"]))
    except KvpreflightError as exc:
        error(str(exc))
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
