"""One engine process: started in its own process group, output to a log file and a tail in
memory, stopped with SIGTERM to the whole family and SIGKILL after a grace period."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from typing import IO

from kvpreflight._internal.files import open_log
from kvpreflight.boot import proctree
from kvpreflight.boot.errors import BootConfigError
from kvpreflight.boot.launch import LaunchPlan

TAIL_LINES = 200


class EngineProcess:
    """A running engine. Not a result type: it changes as the engine runs."""

    def __init__(self, plan: LaunchPlan, log_path: str) -> None:
        self.plan = plan
        self.log_path = log_path
        self.started_at = 0.0
        self.killed = False  # SIGKILL was needed
        self._popen: subprocess.Popen[bytes] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = ""
        self._lock = threading.Lock()
        self._pump: threading.Thread | None = None
        self._targets: set[int] = set()

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def launched(self) -> bool:
        return self._popen is not None

    @property
    def pid(self) -> int:
        assert self._popen is not None
        return self._popen.pid

    def start(self) -> None:
        env = dict(os.environ)
        env.update(self.plan.env)
        log = open_log(self.log_path)
        try:
            self._popen = subprocess.Popen(
                list(self.plan.argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.plan.spec.cwd,
                start_new_session=True,  # own session and process group: Ctrl-C in the terminal
                close_fds=True,          # reaches us, and we stop the engine in order
            )
        except OSError as exc:
            log.close()
            what = exc.strerror or str(exc)
            where = f"in {self.plan.spec.cwd} " if isinstance(exc, FileNotFoundError) and self.plan.spec.cwd else ""
            raise BootConfigError(f"engine {self.name}: cannot start {self.plan.argv[0]!r} {where}({what}); "
                            "install it or fix the engine's command in the spec") from None
        self.started_at = time.monotonic()
        self._pump = threading.Thread(target=self._copy_output, args=(self._popen.stdout, log),
                                      name=f"kvpreflight-log-{self.name}", daemon=True)
        self._pump.start()

    def _copy_output(self, stream: IO[bytes], log: IO[bytes]) -> None:
        fd = stream.fileno()
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                self._remember(chunk.decode("utf-8", "replace"))
        except OSError:
            pass
        finally:
            log.close()
            stream.close()

    def _remember(self, text: str) -> None:
        with self._lock:
            parts = (self._partial + text).replace("\r", "\n").split("\n")
            self._partial = parts.pop()
            self._tail.extend(line for line in parts if line.strip())

    def last_lines(self, count: int = 3) -> list[str]:
        with self._lock:
            lines = list(self._tail)
            if self._partial.strip():
                lines.append(self._partial)
        return [line.rstrip() for line in lines[-count:]]

    def poll(self) -> int | None:
        assert self._popen is not None
        return self._popen.poll()

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def family(self) -> set[int]:
        """The live processes that belong to this engine right now."""
        if self._popen is None:
            return set()
        return proctree.family(self.pid, self.pid)

    # -- stopping -------------------------------------------------------------------------

    def signal(self, sig: int) -> None:
        """Send `sig` to the engine's process group and to every process that left it."""
        if self._popen is None:
            return
        self._targets |= self.family()
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in self._targets:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def gone(self) -> bool:
        """True when the leader is reaped and nothing of the family is alive."""
        if self._popen is None:
            return True
        self._popen.poll()
        if self._popen.returncode is None:
            return False
        self._targets = {pid for pid in self._targets if proctree.alive(pid)}
        return not self._targets and not any(
            info.pgid == self.pid and info.state != "Z" for info in proctree.read_table().values()
        )

    def finish(self, timeout: float = 5.0) -> None:
        """After the family is gone: let the log copier drain the pipe and close the file."""
        if self._pump is not None:
            self._pump.join(timeout)


def stop_all(processes: Iterable[EngineProcess], grace_s: float, *, say: Callable[[str], None] | None = None) -> None:
    """SIGTERM every engine family at once; SIGKILL what is left after `grace_s`; reap all."""
    processes = [p for p in processes if p.launched]
    for proc in processes:
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not all(p.gone() for p in processes):
        time.sleep(0.05)
    for proc in processes:
        if not proc.gone():
            proc.killed = True
            if say is not None:
                say(f"engine {proc.name} (pid {proc.pid}) still running {grace_s:g}s after SIGTERM; sending SIGKILL")
            proc.signal(signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and not all(p.gone() for p in processes):
        for proc in processes:
            if not proc.gone():
                proc.signal(signal.SIGKILL)
        time.sleep(0.05)
    for proc in processes:
        proc.finish()
