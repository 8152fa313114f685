"""`kvpreflight watch` as a service: rounds on an interval, one JSON line per round, the metrics
endpoint and textfile, SIGTERM/SIGINT obeyed within seconds. Every line it writes is scrubbed of
the plan's secrets first."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpreflight._internal.watch.findings import Round
from kvpreflight._internal.watch.loop import Watcher, run_watchers
from kvpreflight._internal.watch.metrics import WatchMetrics
from kvpreflight.errors import ConfigError

DEFAULT_LISTEN = "127.0.0.1:9478"


@dataclass(frozen=True, kw_only=True)
class Listen:
    host: str
    port: int


def parse_listen(text: str) -> Listen | None:
    """HOST:PORT (PORT 0: any free port), or `off`."""
    if text.strip().lower() == "off":
        return None
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{text!r} is not HOST:PORT (for example 127.0.0.1:9478), or off")
    return Listen(host=host, port=int(port))


@dataclass(frozen=True, kw_only=True)
class ServiceOutputs:
    write_line: Callable[[str], None]  # one JSON line per round (stdout)
    progress: Callable[[str], None]  # what the service says (stderr)
    scrub: Callable[[str], str]  # removes every secret value
    metrics: WatchMetrics
    listen: Listen | None = None
    textfile: Path | None = None


def run_service(watchers: Sequence[Watcher], outputs: ServiceOutputs, *, interval_s: float, max_rounds: int | None = None,
                stop: threading.Event | None = None) -> list[Round]:
    """Rounds of every watcher (one deployment after another) until stopped (SIGTERM, SIGINT,
    `stop`) or each ran `max_rounds`; returns each watcher's last round."""
    stop = stop or threading.Event()
    server = None
    if outputs.listen is not None:
        try:
            server = outputs.metrics.serve(outputs.listen.host, outputs.listen.port)
        except OSError as exc:
            raise ConfigError(f"--listen {outputs.listen.host}:{outputs.listen.port}: cannot listen there ({exc.strerror or exc}); "
                              "pick another port or pass --listen off") from None
        host, port = server.server_address[:2]
        outputs.progress(f"metrics on http://{host}:{port}/metrics")

    def emit(round_: Round) -> None:
        outputs.metrics.record(round_)
        outputs.write_line(outputs.scrub(json.dumps(round_.to_dict(), default=str, separators=(",", ":"))))
        if outputs.textfile is not None:
            outputs.metrics.write_textfile(outputs.textfile)

    try:
        with _stopped_by_signals(stop):
            return run_watchers(watchers, stop, emit, interval_s=interval_s, max_rounds=max_rounds)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


@contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set `stop` (the loop then ends within seconds); the previous handlers
    come back afterwards. Off the main thread (a test's), signals are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _: Any) -> None:
        stop.set()

    saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)
