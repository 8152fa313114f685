"""SIGTERM while engines run: raise, so that every `finally` stops them. While they are being
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
from typing import Iterator

EXIT_SIGTERM = 128 + signal.SIGTERM


class Terminated(SystemExit):
    """Raised in the main thread when SIGTERM arrives while a deployment is booted."""

    def __init__(self) -> None:
        super().__init__(EXIT_SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    if not _main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_held(*, deliver: bool = True) -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the duration; afterwards re-deliver them if `deliver`."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum, frame):
        pending.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if deliver:
            for sig in dict.fromkeys(pending):
                os.kill(os.getpid(), sig)
