"""SIGTERM (or SIGHUP) while engines run: raise, so that every `finally` stops them. While they are being
stopped: hold SIGINT/SIGTERM back (a second Ctrl-C must not abandon half-stopped engines) and
deliver them once the clean-up is done.

Signal handlers can only be set from the main thread; elsewhere these are no-ops and the caller
owns signal handling.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn


class Terminated(SystemExit):
    """Raised in the main thread when SIGTERM or SIGHUP arrives while a deployment is booted;
    exits 128 + the signal number, as a shell reports a process killed by it."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(128 + signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    if not _main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> NoReturn:
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def signals_held(*, deliver: bool = True, notice: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for the duration (calling `notice()` when one comes);
    afterwards re-deliver them if `deliver`."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)
        if notice is not None:
            notice()

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if deliver:
            for signum in dict.fromkeys(pending):
                os.kill(os.getpid(), signum)
