"""`python -m kvpreflight.fleet.worker`: boot one deployment, check it, stop it, write an unsigned
record. Started by kvpreflight.fleet.job with the job as JSON on stdin; dies with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvpreflight.fleet.job import PARENT_ENV, WorkerJob

if TYPE_CHECKING:
    from kvpreflight.boot.spec import DeploymentSpec


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


def _spec(job: WorkerJob) -> DeploymentSpec:
    from kvpreflight.boot import parse_spec
    from kvpreflight.fleet.inventory import BootTarget

    target = job.target
    if not isinstance(target, BootTarget):
        from kvpreflight._internal.demo import demo_spec

        return demo_spec(target)
    from kvpreflight._internal.fields import load_yaml
    from kvpreflight.boot.errors import BootConfigError

    return parse_spec(load_yaml(target.spec_text, target.spec_path, BootConfigError), source=target.spec_path,
                      base_dir=os.path.dirname(target.spec_path))


def _start_reaper() -> subprocess.Popen[bytes]:
    """A watcher in its own session that stops our engines if this process is SIGKILLed."""
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
    from kvpreflight import preflight
    from kvpreflight.check_plan import CheckPlan, OutputPlan
    from kvpreflight.errors import KvpreflightError

    job = WorkerJob.from_json(sys.stdin.read())
    try:
        record = preflight.prepare_record(Path(job.record), sign_key=None, subjects=job.subjects, unsigned=True,
                                          command_line=job.command_line, reads_files=True)
        booted = preflight.run_booted(_spec(job), CheckPlan(targets=(), waivers=job.waivers), log_dir=Path(job.log_dir),
                                      progress=_progress)
        preflight.publish(booted.report, OutputPlan(format="json", path=Path(job.report), record=record),
                          files_read=booted.files_read, progress=_progress)
        return booted.report.exit_code
    except KvpreflightError as exc:
        sys.stderr.write(f"kvpreflight: error: {' '.join(str(exc).split())}\n")
        return exc.exit_code


def _progress(message: str) -> None:
    sys.stderr.write(f"kvpreflight: {message}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
