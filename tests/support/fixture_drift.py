"""How a recorded fixture (a body, a /metrics page, a log) differs from what a live engine sent: the
unit tier trusts recorded fixtures, so the real tier names every field, series or line the live
engine no longer sends the way the fixture says (tests/real/test_sglang_live.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def json_drift(recorded: Any, live: Any, where: str = "") -> list[str]:
    """Every field of `recorded` that `live` lacks or holds as another JSON type, by path (a null on
    either side is an unset setting, not a drift; a live field the recording lacks is not one
    either: recordings keep what kvpreflight reads)."""
    if recorded is None or live is None:
        return []
    if isinstance(recorded, Mapping):
        if not isinstance(live, Mapping):
            return [f"{where or '/'}: recorded an object, live sent {_kind(live)}"]
        out = [f"{where}/{k}: recorded, not sent live" for k in recorded if k not in live]
        for k in recorded:
            if k in live:
                out += json_drift(recorded[k], live[k], f"{where}/{k}")
        return out
    if isinstance(recorded, list):
        if not isinstance(live, list):
            return [f"{where}: recorded a list, live sent {_kind(live)}"]
        return json_drift(recorded[0], live[0], f"{where}[0]") if recorded and live else []
    if _kind(recorded) != _kind(live):
        return [f"{where}: recorded {_kind(recorded)} {recorded!r}, live sent {_kind(live)} {live!r}"]
    return []


SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s")


def _series(text: str) -> dict[str, set[str]]:
    """metric name -> the label names its samples carry."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = {pair.split("=", 1)[0].strip() for pair in (m["labels"] or "").split(",") if "=" in pair}
            out.setdefault(m["name"], set()).update(labels)
    return out


def metrics_drift(recorded: str, live: str, *, absent_until_counted: Iterable[str] = ()) -> list[str]:
    """Every series of the recorded /metrics the live page lacks, or whose labels it names otherwise.
    `absent_until_counted`: counters the engine sends only once they first move (named, not failed)."""
    rec, got = _series(recorded), _series(live)
    lazy = set(absent_until_counted)
    out = []
    for name, labels in rec.items():
        if name not in got:
            if name not in lazy:
                out.append(f"{name}: recorded, not sent live")
        elif labels - got[name]:
            out.append(f"{name}: recorded labels {sorted(labels - got[name])} not sent live (live: {sorted(got[name])})")
    return out


def lines_drift(patterns: Mapping[str, re.Pattern[str]], recorded: str, live: str) -> list[str]:
    """Each pattern (what kvpreflight reads a log with) that matches a recorded line but no live one."""
    return [f"{what}: matches the recorded log, no line of the live log" for what, p in patterns.items()
            if any(p.search(x) for x in recorded.splitlines()) and not any(p.search(x) for x in live.splitlines())]
