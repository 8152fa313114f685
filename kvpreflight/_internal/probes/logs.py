"""The log lines kvpreflight reads or owns, followed while the probes run: what each engine's and
router's log gained between two moments, as danger lines (kvpreflight._internal.probes.results.DangerLine)
that tie to the probe in flight. Only the signal's fixed wording and the request id travel on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from kvpreflight._internal.engines.interface import LOG_ID_PREFIX
from kvpreflight._internal.engines.log_patterns import LogSignal
from kvpreflight._internal.files import FileKind, read_new
from kvpreflight._internal.probes.results import DangerLine, ProbeResult

MAX_READ_BYTES = FileKind.LOG.cap  # of new log per look: a log that grows faster is read in part, from its newest end


class LogWatch:
    """Each source's log from where it stood when the watch began."""

    def __init__(self, sources: Mapping[str, tuple[Path, Sequence[LogSignal]]]) -> None:
        self._sources = {url: (path, tuple(signals)) for url, (path, signals) in sources.items() if signals}
        self._offsets = {url: _size(path) for url, (path, _) in self._sources.items()}

    def take(self) -> tuple[DangerLine, ...]:
        """The danger lines every log gained since the last look (whole lines only)."""
        found: list[DangerLine] = []
        for url, (path, signals) in self._sources.items():
            for line in self._new_lines(url, path):
                for signal in signals:
                    matched, rid = signal.request_in(line)
                    if matched:
                        found.append(DangerLine(source=url, what=signal.what, request_id=rid, hazard=signal.hazard,
                                                detail=signal.detail_in(line)))
                        break
        return tuple(found)

    def _new_lines(self, url: str, path: Path) -> list[str]:
        start, end = self._offsets[url], _size(path)
        if end < start:  # rotated or truncated: read it from the top
            start = 0
        start = max(start, end - MAX_READ_BYTES)
        data = read_new(path, start, end)
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        self._offsets[url] = start + len(whole)
        return whole.decode("utf-8", errors="replace").splitlines()


def named_by_request_id(probes: Sequence[ProbeResult], untied: Iterable[DangerLine]
                        ) -> tuple[list[ProbeResult], tuple[DangerLine, ...]]:
    """The capacity probes' lines, each naming the probe whose request id it names, whenever it
    was logged: an engine may log a request's trouble long after it (vLLM's prefill, when the KV
    lease of a request the decode never read runs out, 30 s later). Concurrent probes keep sharing
    one tuple of lines."""
    ids = {p.completion.request_id: f"probe {p.name}'s request" for p in probes if p.completion.request_id}
    done: dict[int, tuple[DangerLine, ...]] = {}
    out = []
    for probe in probes:
        if id(probe.danger_lines) not in done:
            done[id(probe.danger_lines)] = name_lines(probe.danger_lines, ids)
        out.append(replace(probe, danger_lines=done[id(probe.danger_lines)]))
    return out, name_lines(untied, ids)


def name_lines(lines: Iterable[DangerLine], ids: Mapping[str, str],
               other: str = "one of kvpreflight's requests other than the probes (calibration, health)"
               ) -> tuple[DangerLine, ...]:
    """Each line that names one of kvpreflight's request ids (`ids`: id -> which request) says
    which request; `other` names one of kvpreflight's ids outside `ids`. Engines and routers that
    rewrite the id (vllm-router) leave lines tied by time."""
    def named(line: DangerLine) -> DangerLine:
        if not line.request_id:
            return line
        which = next((label for rid, label in ids.items() if rid in line.request_id), None)
        if which is not None:
            return replace(line, names=which)
        if LOG_ID_PREFIX in line.request_id:
            return replace(line, names=other)
        return line
    return tuple(named(d) for d in lines)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
