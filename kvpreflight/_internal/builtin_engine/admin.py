"""Test only: switch the engine's faults on and off while it runs, so a test can show a long-lived
watcher catching a change (kvpreflight watch). Refused unless the engine listens on 127.0.0.1:
nothing off the machine can give an engine a bug. Faults stay out of every report and log line,
as at start (config.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvpreflight._internal.builtin_engine.config import ServeConfigError, parse_faults

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.server import EngineHandler

LOOPBACK = "127.0.0.1"
FAULTS_PATH = "/_kvpreflight/faults"


def set_faults(handler: EngineHandler, body: dict[str, Any]) -> None:
    """POST {"faults": [NAME, ...], "transfer_fail_every": N}: the faults from now on (an empty
    list and 0 switch them off)."""
    if handler.server.server_address[0] != LOOPBACK:
        handler.reply_json(403, {"error": {"message": f"{FAULTS_PATH} is for tests on {LOOPBACK} only"}})
        return
    names, every = body.get("faults", []), body.get("transfer_fail_every", 0)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) \
            or not isinstance(every, int) or isinstance(every, bool) or every < 0:
        handler.reply_json(400, {"error": {"message": "send {\"faults\": [NAME, ...], \"transfer_fail_every\": N >= 0}"}})
        return
    try:
        faults = parse_faults(names, FAULTS_PATH)
    except ServeConfigError as exc:
        handler.reply_json(400, {"error": {"message": str(exc)}})
        return
    engine = handler.engine
    engine.faults = faults
    engine.config = replace(engine.config, faults=faults, transfer_fail_every=every)
    handler.reply_json(200, {"faults": sorted(f.value for f in faults), "transfer_fail_every": every})
